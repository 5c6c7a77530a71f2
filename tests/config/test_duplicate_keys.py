"""A YAML file that repeats a key fails naming the file, the dotted key and both lines, where plain YAML would
keep the last one and silently drop the first (half of a section written twice)."""

import re

import pytest

from asyncrl.config import ConfigError, load_config


def write(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_a_repeated_top_level_section_names_both_lines(tmp_path):
    path = write(tmp_path, "actor:\n  ppo_mini_batch_size: 8\nrollout:\n  n: 2\nactor:\n  optim:\n    lr: 1.0e-5\n")
    with pytest.raises(ConfigError, match=rf"^config file {re.escape(str(path))}: section actor appears twice, at "
                                          r"lines 1 and 5; YAML would keep only the second: merge them into one$"):
        load_config(path)


def test_a_repeated_key_inside_a_nested_section_is_named_by_its_dotted_path(tmp_path):
    path = write(tmp_path, "actor:\n  optim:\n    lr: 1.0e-5\n    weight_decay: 0.0\n    lr: 2.0e-5\n")
    with pytest.raises(ConfigError, match=r": key actor\.optim\.lr appears twice, at lines 3 and 5;"):
        load_config(path)


def test_a_repeated_key_in_a_flow_mapping_or_a_list_item_is_found_too(tmp_path):
    path = write(tmp_path, "rollout: {n: 2, temperature: 0.7, n: 4}\n")
    with pytest.raises(ConfigError, match=r": key rollout\.n appears twice, on line 1 \(columns 11 and 35\);"):
        load_config(path)
    path = write(tmp_path, "trainer:\n  logger:\n    - {name: a, name: b}\n")
    with pytest.raises(ConfigError, match=r": key trainer\.logger\[0\]\.name appears twice, on line 3 "):
        load_config(path)


def test_the_same_name_in_different_sections_and_merge_keys_are_fine(tmp_path):
    path = write(tmp_path, "rollout:\n  n: 4\n  val_kwargs:\n    n: 2\n"
                           "actor:\n  optim: &adam\n    lr: 1.0e-5\n    weight_decay: 0.0\n"
                           "critic:\n  optim:\n    <<: *adam\n    lr: 3.0e-5\n")
    config = load_config(path)
    assert (config.rollout.n, config.rollout.val_kwargs.n) == (4, 2)
    # A merged mapping's keys are defaults the mapping may override: YAML's meaning, not a repetition.
    assert (config.critic.optim.lr, config.critic.optim.weight_decay) == (3.0e-5, 0.0)


def test_a_recursive_alias_does_not_hang_the_check(tmp_path):
    path = write(tmp_path, "data:\n  train_files: &files [a.jsonl, *files]\n")
    with pytest.raises(ConfigError, match=r"data\.train_files\[1\]: expected str"):
        load_config(path)


def test_an_override_with_a_repeated_key_is_refused():
    with pytest.raises(ConfigError, match=r"^override 'rollout=\{n: 2, n: 4\}': key n appears twice, on line 1 \(columns 2 and 8\)"):
        load_config(None, ["rollout={n: 2, n: 4}"])
