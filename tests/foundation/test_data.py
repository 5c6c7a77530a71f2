"""Dataset reading errors name file and row; the sampler resumes exactly; built-in tasks score right."""

import json
import logging
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as parquet
import pytest

from asyncrl.data import DatasetError, PromptSampler, read_prompt_file
from asyncrl.data.make import make_task, write_task
from asyncrl.data.tasks import arithmetic, countdown


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


GOOD_ROW = {"prompt": [{"role": "user", "content": "1+1="}], "data_source": "asyncrl/arithmetic",
            "reward_model": {"ground_truth": "2"}, "extra_info": {"index": 0}}


def test_reads_parquet_and_jsonl_in_verl_schema(tmp_path):
    parquet.write_table(pa.Table.from_pylist([GOOD_ROW, GOOD_ROW]), tmp_path / "a.parquet")
    write_jsonl(tmp_path / "a.jsonl", [GOOD_ROW])
    for name, count in (("a.parquet", 2), ("a.jsonl", 1)):
        records = read_prompt_file(tmp_path / name)
        assert len(records) == count
        assert records[0].messages == [{"role": "user", "content": "1+1="}]
        assert records[0].ground_truth == "2"
        assert records[0].data_source == "asyncrl/arithmetic"
        assert records[-1].prompt_id == f"{name}:{count - 1}"


@pytest.mark.parametrize("bad_row, message", [
    ({"data_source": "x"}, r"row 1: missing column 'prompt'"),
    ({"prompt": []}, r"row 1: 'prompt' must be a non-empty list"),
    ({"prompt": [{"content": "hi"}]}, r"row 1: prompt\[0\] must have 'role' and 'content'"),
    ({"prompt": [{"role": "robot", "content": "hi"}]}, r"row 1: prompt\[0\] has role 'robot'"),
    ({"prompt": "hi", "reward_model": "7"}, r"row 1: reward_model must be a mapping"),
    ({"prompt": "hi", "reward_model": {"answer": "7"}},
     r"row 1: reward_model\.ground_truth is missing or null \(reward_model keys: \['answer'\]\)"),
    ({"prompt": "hi", "extra_info": [1]}, r"row 1: extra_info must be a mapping"),
])
def test_malformed_row_names_file_and_row(tmp_path, bad_row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD_ROW, bad_row])
    with pytest.raises(DatasetError, match=rf"bad\.jsonl: {message}"):
        read_prompt_file(path)


def test_parquet_ground_truth_null_or_of_a_wrong_type_names_file_and_row(tmp_path):
    parquet.write_table(pa.Table.from_pylist([GOOD_ROW, dict(GOOD_ROW, reward_model={"ground_truth": None})]),
                        tmp_path / "null.parquet")
    with pytest.raises(DatasetError, match=r"null\.parquet: row 1: reward_model\.ground_truth is missing or null"):
        read_prompt_file(tmp_path / "null.parquet")
    parquet.write_table(pa.Table.from_pylist([dict(GOOD_ROW, reward_model={"ground_truth": b"2"})]),
                        tmp_path / "binary.parquet")
    with pytest.raises(DatasetError, match=(r"binary\.parquet: row 0: reward_model\.ground_truth must be a string, "
                                            r"number, list or mapping, got bytes b'2'")):
        read_prompt_file(tmp_path / "binary.parquet")


def test_file_level_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        read_prompt_file(tmp_path / "none.parquet")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DatasetError, match="empty.jsonl holds no rows"):
        read_prompt_file(tmp_path / "empty.jsonl")
    parquet.write_table(pa.Table.from_pylist([GOOD_ROW]).slice(0, 0), tmp_path / "empty.parquet")  # columns, no rows
    with pytest.raises(DatasetError, match="empty.parquet holds no rows"):
        read_prompt_file(tmp_path / "empty.parquet")
    (tmp_path / "broken.jsonl").write_text(json.dumps(GOOD_ROW) + "\n{not json\n")
    with pytest.raises(DatasetError, match="broken.jsonl: line 2 is not valid JSON"):
        read_prompt_file(tmp_path / "broken.jsonl")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="unsupported format '.csv'"):
        read_prompt_file(tmp_path / "rows.csv")
    (tmp_path / "fake.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match="fake.parquet is not a readable parquet file"):
        read_prompt_file(tmp_path / "fake.parquet")


def drain(sampler):
    indices = []
    while (index := sampler.next_index()) is not None:
        indices.append(index)
    return indices


@pytest.mark.parametrize("shuffle", [True, False])
def test_sampler_resume_yields_exactly_the_remaining_prompts(shuffle):
    reference = drain(PromptSampler(10, shuffle=shuffle, seed=3, total_epochs=3))
    assert len(reference) == 30
    for epoch_block in range(3):
        assert sorted(reference[10 * epoch_block:10 * (epoch_block + 1)]) == list(range(10))
    for cut in (0, 4, 10, 17, 29, 30):
        sampler = PromptSampler(10, shuffle=shuffle, seed=3, total_epochs=3)
        head = sampler.next_batch(cut)
        state = json.loads(json.dumps(sampler.state_dict()))  # survives a checkpoint file
        restored = PromptSampler(10, shuffle=shuffle, seed=3, total_epochs=3)
        restored.load_state_dict(state)
        assert restored.num_remaining == 30 - cut
        assert head + drain(restored) == reference


def test_sampler_epochs_differ_and_batches_cross_epochs():
    sampler = PromptSampler(5, shuffle=True, seed=0, total_epochs=2)
    first, second = sampler.next_batch(4), sampler.next_batch(4)
    assert len(second) == 4  # one prompt from epoch 0, three from epoch 1: no gap at the boundary
    assert sampler.epoch == 1
    assert len(sampler.next_batch(4)) == 2 and sampler.is_exhausted


def test_sampler_refuses_state_of_another_dataset():
    state = PromptSampler(10, True, 1, 1).state_dict()
    with pytest.raises(ValueError, match="sampler state is for 10 prompts"):
        PromptSampler(11, True, 1, 1).load_state_dict(state)


def test_builtin_scorers_give_one_to_truth_and_zero_to_wrong(tmp_path):
    paths = write_task(make_task("arithmetic"), tmp_path / "a", 50, 10, seed=1)
    for record in read_prompt_file(paths["val"]):
        assert arithmetic.score(record.ground_truth, record.ground_truth) == 1.0
        assert arithmetic.score(str(int(record.ground_truth) + 1), record.ground_truth) == 0.0
        assert arithmetic.score("", record.ground_truth) == 0.0
    paths = write_task(make_task("countdown"), tmp_path / "c", 50, 10, seed=1)
    for record in read_prompt_file(paths["val"]):
        assert countdown.score(record.extra_info["answer"], record.ground_truth) == 1.0
    truth = {"numbers": [3, 5, 7], "target": 22}
    assert countdown.score("7+3*5", truth) == 1.0        # another correct expression also scores
    assert countdown.score("3*5+7+1", truth) == 0.0      # a number that was not given
    assert countdown.score("3*5", truth) == 0.0          # not every number used
    assert countdown.score("__import__('os')", truth) == 0.0


def test_task_knobs_change_difficulty():
    rng = np.random.default_rng(0)
    hard = make_task("arithmetic", {"min_digits": "3", "max_digits": "3", "num_operands": "3"})
    question, answer = hard.make_problem(rng)
    assert len([part for part in question.replace("-", "+").rstrip("=").split("+")]) == 3
    assert all(len(part) == 3 for part in question.replace("-", "+").rstrip("=").split("+"))
    assert int(answer) == eval(question.rstrip("="))
    with pytest.raises(ValueError, match="min_digits <= max_digits"):
        make_task("arithmetic", {"min_digits": "3", "max_digits": "2"})


def test_prompt_dataset_applies_template_and_overlong_policy(tmp_path, caplog):
    from asyncrl.config import load_config
    from asyncrl.data.dataset import PromptDataset
    from asyncrl.models import load_tokenizer, save_char_tokenizer
    tokenizer = load_tokenizer(save_char_tokenizer(tmp_path / "tok"))
    rows = [dict(GOOD_ROW, prompt=[{"role": "user", "content": text}]) for text in ("1+1=", "12345+678=", "9=")]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    limit = len(tokenizer.encode("<|user|>1+1=<|assistant|>", add_special_tokens=False))
    base = ["data.max_prompt_length=" + str(limit)]
    caplog.set_level(logging.WARNING, logger="asyncrl")
    dataset = PromptDataset.from_files([str(path)], tokenizer, load_config(None, base).data)
    assert dataset.num_dropped == 1 and len(dataset) == 2
    assert (f"dropped 1 of 3 prompts of {path} longer than data.max_prompt_length={limit} (the longest has 12 "
            "tokens)") in caplog.text
    assert tokenizer.decode(dataset[0].prompt_ids) == "<|user|>1+1=<|assistant|>"
    assert dataset[1].record.prompt_id == "p.jsonl:2"
    left = PromptDataset.from_files([str(path)], tokenizer, load_config(
        None, base + ["data.filter_overlong_prompts=false", "data.truncation=left"]).data)
    assert len(left) == 3 and len(left[1].prompt_ids) == limit
    assert tokenizer.decode(left[1].prompt_ids).endswith("678=<|assistant|>")
    assert left.num_truncated == 1
    assert f"truncated 1 of 3 prompts of {path} to data.max_prompt_length={limit} (data.truncation=left)" in caplog.text
    right = PromptDataset.from_files([str(path)], tokenizer, load_config(
        None, base + ["data.filter_overlong_prompts=false", "data.truncation=right"]).data)
    assert len(right[1].prompt_ids) == limit and tokenizer.decode(right[1].prompt_ids).startswith("<|user|>12345")
    with pytest.raises(DatasetError, match=r"p\.jsonl:1: prompt has \d+ tokens, more than data\.max_prompt_length"):
        PromptDataset.from_files([str(path)], tokenizer, load_config(
            None, base + ["data.filter_overlong_prompts=false"]).data)
    # One token per character plus two of markup (<|user|>, <|assistant|>): 1+1= 6, 9= 4, 12345+678= 12.
    with pytest.raises(DatasetError, match=re.escape(
            f"{path}: no prompt left after dropping 3 prompts longer than data.max_prompt_length=2 tokens (chat "
            "template included): the shortest has 4 tokens, the longest 12; raise data.max_prompt_length")):
        PromptDataset.from_files([str(path)], tokenizer, load_config(None, ["data.max_prompt_length=2"]).data)
    with pytest.raises(DatasetError, match=r"no dataset files given \(data\.train_files / data\.val_files is empty\)"):
        PromptDataset.from_files([], tokenizer, load_config(None, base).data)
