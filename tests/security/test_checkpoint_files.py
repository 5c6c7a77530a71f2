"""Checkpoints hold data only and are checked by content: a planted pickle in any place earlier versions
unpickled is refused naming the file and runs nothing; the trainer state and the fully-async state come back
exactly; a file altered without changing its size makes the newest checkpoint fall back to the one before."""

from __future__ import annotations

import hashlib
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from asyncrl.core.checkpoint import DRIVER_FILE, CheckpointManager
from asyncrl.core.records import Sample
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult
from asyncrl.recipes.fully_async.group import Group
from asyncrl.recipes.fully_async.state_codec import (ARRAYS_FILE, LEGACY_PICKLE_FILE, STRUCTURE_FILE, StateFileError,
                                                     encode_state, load_state)
from asyncrl.train.checkpoint import CheckpointFormatError, load_trainer_state, save_trainer_state


class WritesMarker:
    """Unpickling this runs `os.system`-like code: it creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def plant(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(WritesMarker(marker)))


def test_the_planted_payload_really_runs_code_when_unpickled(tmp_path):
    """The payload the other tests plant is live: plain unpickling creates the marker."""
    marker = tmp_path / "ran"
    plant(tmp_path / "payload.pkl", marker)
    pickle.loads((tmp_path / "payload.pkl").read_bytes())
    assert marker.exists()


# ---- the trainer state ----------------------------------------------------------------------------------------
def tiny_components(seed: int):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, optimizer, scheduler


def train(model, optimizer, scheduler, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(3, 4)).square().sum()
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def draws() -> tuple:
    return torch.rand(3), np.random.rand(3), random.random()


def test_trainer_state_round_trips_exactly_through_data_only_files(tmp_path):
    """Saved after 3 steps, then 2 more steps (their data drawn from the RNGs): a different model loaded from the
    checkpoint draws the same numbers and ends the 2 steps bit for bit equal (weights, AdamW moments, the LR
    schedule's position, every RNG)."""
    model, optimizer, scheduler = tiny_components(seed=0)
    train(model, optimizer, scheduler, steps=3)
    save_trainer_state(tmp_path, {"actor": (model, optimizer, scheduler)}, extra={"actor_skipped": 2})
    expected_draws = draws()
    train(model, optimizer, scheduler, steps=2)

    assert sorted(path.name for path in tmp_path.iterdir()) == ["rank_0.json", "rank_0.safetensors"]
    fresh = tiny_components(seed=1)
    assert load_trainer_state(tmp_path, {"actor": fresh}) == {"actor_skipped": 2}
    assert fresh[2].last_epoch == 3 and fresh[1].param_groups[0]["betas"] == (0.8, 0.95)
    loaded_draws = draws()
    assert torch.equal(loaded_draws[0], expected_draws[0]) and np.array_equal(loaded_draws[1], expected_draws[1])
    assert loaded_draws[2] == expected_draws[2]
    train(*fresh, steps=2)
    for first, second in zip(fresh[0].parameters(), model.parameters()):
        assert torch.equal(first, second)
    for first, second in zip(fresh[1].state.values(), optimizer.state.values()):
        assert torch.equal(first["exp_avg_sq"], second["exp_avg_sq"])
    assert fresh[1].param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] == 0.1 / 6


@pytest.mark.parametrize("planted", ["rank_0.pt", "shards/.metadata", "shards/__0_0.distcp"])
def test_a_planted_pickle_where_the_trainer_state_was_unpickled_is_refused_and_runs_nothing(tmp_path, planted):
    model, optimizer, scheduler = tiny_components(seed=0)
    save_trainer_state(tmp_path, {"actor": (model, optimizer, scheduler)}, extra={})
    marker = tmp_path.parent / f"ran_{tmp_path.name}"
    plant(tmp_path / planted, marker)
    with pytest.raises(CheckpointFormatError, match=f"{tmp_path / planted} is a pickle"):
        load_trainer_state(tmp_path, {"actor": tiny_components(seed=1)})
    assert not marker.exists()


@pytest.mark.parametrize("replaced", ["rank_0.json", "rank_0.safetensors"])
def test_a_pickle_in_place_of_a_data_file_is_refused_naming_it(tmp_path, replaced):
    save_trainer_state(tmp_path, {"actor": tiny_components(seed=0)}, extra={})
    marker = tmp_path.parent / f"ran_{tmp_path.name}"
    plant(tmp_path / replaced, marker)
    with pytest.raises(CheckpointFormatError, match=f"file {tmp_path / replaced} is not a readable"):
        load_trainer_state(tmp_path, {"actor": tiny_components(seed=1)})
    assert not marker.exists()


def test_another_models_state_is_refused_naming_the_tensor(tmp_path):
    save_trainer_state(tmp_path, {"actor": tiny_components(seed=0)}, extra={})
    wider = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(wider.parameters())
    with pytest.raises(CheckpointFormatError, match=r"tensor sharded/actor.model/0.weight has shape \(8, 4\), this "
                                                    r"model's has \(16, 4\)"):
        load_trainer_state(tmp_path, {"actor": (wider, optimizer, None)})


# ---- the fully-async state ------------------------------------------------------------------------------------
def result(request_id: str, response: list[int], finish_reason: str, version: int) -> GenerationResult:
    return GenerationResult(request_id, np.array([1, 5, 7], dtype=np.int32), np.array(response, dtype=np.int32),
                            np.linspace(-0.5, -0.1, len(response), dtype=np.float32),
                            np.full(len(response), version, dtype=np.int32), finish_reason)


def fully_async_state() -> dict:
    record = PromptRecord("train.parquet:7", [{"role": "user", "content": "2+3=?"}], "arith",
                          {"answer": 5, "alternatives": [5.0, "five"]}, {"split": "train", "index": 7})
    prompt = TokenizedPrompt(record, [1, 5, 7])
    parked = Group(prompt, epoch=1, serial=12, results=[result("r0", [9, 4, 2], "stop", 3),
                                                         result("r1", [], "abort", 3), None])
    queued = [[Sample(prompt, group_index=0, sample_index=index, result=result(f"q{index}", [4, 2], "length", 2),
                      score=0.5 * index, reward_extra={"format": 1.0}, reward_error=None if index else "timeout")
               for index in range(2)]]
    return {"rollouter": {"sampler": {"epoch": 1, "position": 8, "seed": 3, "num_prompts": 16},
                          "parked": [parked], "next_serial": 13},
            "queue": queued, "local_step": 5, "stale_samples": 4, "trained_prompt_keys": ["train.parquet:1"],
            "numbers": {"scalar": np.float32(0.25), 3: (1, "a")}}


def write_state(folder: Path, state: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, payload in encode_state(state).items():
        (folder / name).write_bytes(payload)


def assert_same(first, second, where="state"):
    assert type(first) is type(second), where
    if isinstance(first, np.ndarray):
        assert first.dtype == second.dtype and np.array_equal(first, second) and second.flags.writeable, where
    elif isinstance(first, (list, tuple)):
        assert len(first) == len(second), where
        for index, (a, b) in enumerate(zip(first, second)):
            assert_same(a, b, f"{where}.{index}")
    elif isinstance(first, dict):
        assert list(first) == list(second), where
        for key in first:
            assert_same(first[key], second[key], f"{where}.{key}")
    elif hasattr(first, "__dataclass_fields__"):
        for name in first.__dataclass_fields__:
            assert_same(getattr(first, name), getattr(second, name), f"{where}.{name}")
    else:
        assert first == second, where


def test_fully_async_state_round_trips_records_arrays_and_types(tmp_path):
    state = fully_async_state()
    write_state(tmp_path, state)
    assert sorted(path.name for path in tmp_path.iterdir()) == [STRUCTURE_FILE, ARRAYS_FILE]
    loaded = load_state(tmp_path)
    assert_same(state, loaded)
    parked = loaded["rollouter"]["parked"][0]
    assert parked.results[1].num_response_tokens == 0 and parked.results[2] is None and not parked.is_generated
    assert isinstance(loaded["numbers"]["scalar"], np.float32)
    structure = json.loads((tmp_path / STRUCTURE_FILE).read_text())
    assert structure["version"] == 1


def test_no_state_file_means_no_saved_state(tmp_path):
    assert load_state(tmp_path) is None


def test_a_planted_pickle_where_the_fully_async_state_was_unpickled_is_refused_and_runs_nothing(tmp_path):
    write_state(tmp_path, fully_async_state())
    marker = tmp_path.parent / f"ran_{tmp_path.name}"
    plant(tmp_path / LEGACY_PICKLE_FILE, marker)
    with pytest.raises(StateFileError, match=f"checkpoint file {tmp_path / LEGACY_PICKLE_FILE} is a pickle"):
        load_state(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("replaced, message", [(STRUCTURE_FILE, "is not valid JSON"),
                                               (ARRAYS_FILE, "is not a readable safetensors file")])
def test_a_pickle_in_place_of_a_state_file_is_refused_naming_it(tmp_path, replaced, message):
    write_state(tmp_path, fully_async_state())
    marker = tmp_path.parent / f"ran_{tmp_path.name}"
    plant(tmp_path / replaced, marker)
    with pytest.raises(StateFileError, match=f"{tmp_path / replaced} {message}"):
        load_state(tmp_path)
    assert not marker.exists()


def test_a_record_type_the_codec_does_not_know_is_refused_on_both_sides(tmp_path):
    class Unregistered:
        pass

    with pytest.raises(TypeError, match=r"state.queue.0 is a .*Unregistered, which the state codec does not know"):
        encode_state({"queue": [Unregistered()]})
    write_state(tmp_path, {"queue": []})
    structure = json.loads((tmp_path / STRUCTURE_FILE).read_text())
    structure["state"]["map"]["queue"] = [{"record": "os.system", "fields": {"command": "touch ran"}}]
    (tmp_path / STRUCTURE_FILE).write_text(json.dumps(structure))
    with pytest.raises(StateFileError, match=r"state.queue.0 is a record of unknown type 'os.system'"):
        load_state(tmp_path)


def test_a_newer_state_version_is_refused(tmp_path):
    write_state(tmp_path, {"local_step": 1})
    structure = json.loads((tmp_path / STRUCTURE_FILE).read_text())
    (tmp_path / STRUCTURE_FILE).write_text(json.dumps({**structure, "version": 99}))
    with pytest.raises(StateFileError, match="is version 99, newer than this asyncrl reads"):
        load_state(tmp_path)


# ---- integrity by content -------------------------------------------------------------------------------------
def save_checkpoints(root: Path, steps: list[int]) -> CheckpointManager:
    manager = CheckpointManager(root, max_checkpoints=5)
    for step in steps:
        manager.save(step, {"step": step}, lambda folder, step=step: write_trainer_file(Path(folder), step),
                     artifacts={STRUCTURE_FILE: b'{"version": 1, "state": null}'})
    return manager


def write_trainer_file(folder: Path, step: int) -> None:
    folder.mkdir(parents=True)
    save_file({"weight": torch.full((1024,), float(step))}, folder / "rank_0.safetensors")


def test_manifest_records_each_files_size_and_sha256(tmp_path):
    manager = save_checkpoints(tmp_path, [1])
    manifest = json.loads((tmp_path / "step_1" / DRIVER_FILE).read_text())["manifest"]
    shard = (tmp_path / "step_1" / "trainer" / "rank_0.safetensors").read_bytes()
    assert manifest["trainer/rank_0.safetensors"]["size"] == len(shard) > 4096
    assert manifest["trainer/rank_0.safetensors"]["sha256"] == hashlib.sha256(shard).hexdigest()
    assert manager.check(tmp_path / "step_1") is None


def test_a_same_size_corruption_is_found_by_content_and_the_previous_checkpoint_is_used(tmp_path, caplog):
    manager = save_checkpoints(tmp_path, [1, 2])
    shard = tmp_path / "step_2" / "trainer" / "rank_0.safetensors"
    data = bytearray(shard.read_bytes())
    size = len(data)
    data[2048] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert shard.stat().st_size == size
    assert manager.find_resumable() == tmp_path / "step_1"
    assert "trainer/rank_0.safetensors does not match its SHA-256" in caplog.text


def test_a_file_the_checkpoint_did_not_write_makes_it_skipped(tmp_path, caplog):
    manager = save_checkpoints(tmp_path, [1, 2])
    marker = tmp_path / "ran"
    plant(tmp_path / "step_2" / "trainer" / "rank_0.pt", marker)
    assert manager.find_resumable() == tmp_path / "step_1"
    assert "trainer/rank_0.pt was not written with the checkpoint" in caplog.text
    assert not marker.exists()


def test_a_checkpoint_from_before_content_hashes_is_skipped_with_the_reason(tmp_path, caplog):
    manager = save_checkpoints(tmp_path, [1])
    driver = tmp_path / "step_1" / DRIVER_FILE
    state = json.loads(driver.read_text())
    state["manifest"] = {name: entry["size"] for name, entry in state["manifest"].items()}
    driver.write_text(json.dumps(state))
    assert manager.find_resumable() is None
    assert "has no content hashes (written by an older asyncrl" in caplog.text


@pytest.mark.parametrize("planted", ["trainer/rank_0.pt", "trainer/rank_0.safetensors"])
def test_a_manifest_rewritten_to_list_a_planted_pickle_makes_the_checkpoint_skipped_before_loading(tmp_path, caplog,
                                                                                                  planted):
    """The manifest is rewritten with the planted file's true size and hash, so only the content tells: the
    newest checkpoint is skipped naming the file and the one before is resumed from, and nothing is unpickled."""
    manager = save_checkpoints(tmp_path, [1, 2])
    marker = tmp_path / "ran"
    plant(tmp_path / "step_2" / planted, marker)
    driver = tmp_path / "step_2" / DRIVER_FILE
    state = json.loads(driver.read_text())
    payload = (tmp_path / "step_2" / planted).read_bytes()
    state["manifest"][planted] = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    driver.write_text(json.dumps(state))
    assert manager.find_resumable() == tmp_path / "step_1"
    assert f"{planted} is a pickle (asyncrl never unpickles checkpoint files" in caplog.text
    assert not marker.exists()
    (tmp_path / "step_2" / planted).write_bytes(b"#!/bin/sh\n" + payload)
    state["manifest"][planted] = {"size": len(payload) + 10,
                                  "sha256": hashlib.sha256(b"#!/bin/sh\n" + payload).hexdigest()}
    driver.write_text(json.dumps(state))
    assert manager.check(tmp_path / "step_2") == f"{planted} is neither JSON nor safetensors, the only formats a " \
                                                 "checkpoint holds"


def test_a_nan_weight_in_a_trainer_checkpoint_is_named_at_load(tmp_path):
    model, optimizer, scheduler = tiny_components(seed=0)
    save_trainer_state(tmp_path, {"actor": (model, optimizer, scheduler)}, extra={})
    shard = tmp_path / "rank_0.safetensors"
    tensors = load_file(shard)
    weight = next(name for name in sorted(tensors) if name.endswith("model/0.weight"))
    tensors[weight][0, 0] = float("inf")
    save_file(tensors, shard)
    with pytest.raises(CheckpointFormatError, match=rf"trainer checkpoint file {shard}: actor tensor 0\.weight holds "
                                                    r"1 non-finite value\(s\)"):
        load_trainer_state(tmp_path, {"actor": tiny_components(seed=1)})
