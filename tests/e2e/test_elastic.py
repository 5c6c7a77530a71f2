"""Elastic rollout replicas through real Ray actors: a fully_async run on the demo's task grows from one replica to
two and back to one while it trains (`asyncrl scale`, applied at the next weight sync). Every prompt of the epoch
is trained exactly once, every token carries the version its step trained at (an on-policy pipeline: a new replica
that took work before receiving the current weights would stamp its start-up version 0), and the throughput of
each phase is in the metrics (samples per second per replica). A replica killed each time it starts is retired
after rollout.max_replica_failures failures in a row, and the run finishes on the other."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pyarrow.parquet as parquet

from asyncrl.launch import runtime, train
from asyncrl.rollout.elastic import request_scale
from asyncrl.telemetry import read_metrics
from tests.e2e.replica_killer import last_step
from tests.e2e.test_faults import trained_prompts
from tests.e2e.test_fully_async import FULLY_ASYNC, dumped, training_rows

NUM_PROMPTS, BATCH = 128, 8


def rows_so_far(output: Path) -> list[dict]:
    try:
        return read_metrics(output / "metrics.jsonl")
    except (FileNotFoundError, ValueError):
        return []


def scale_one_two_one(output: Path, timeout_s: float, done: list[str], metric: str) -> None:
    """Asks for 2 replicas once step 2 is logged, and for 1 again once `metric` says 2 replicas ran."""
    deadline = time.monotonic() + timeout_s
    while last_step(output) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    request_scale(output, 2)
    done.append("grow")
    while time.monotonic() < deadline:
        if any(row.get(metric) == 2 for row in rows_so_far(output)):
            request_scale(output, 1)
            done.append("shrink")
            return
        time.sleep(0.1)


def phases(values: list[float]) -> list[float]:
    """Consecutive equal values collapsed: [1, 1, 2, 2, 1] -> [1, 2, 1]."""
    return [value for index, value in enumerate(values) if index == 0 or values[index - 1] != value]


def epoch_of(raw_policy, tmp_path: Path) -> Path:
    epoch = tmp_path / "epoch.parquet"
    parquet.write_table(parquet.read_table(raw_policy["train"]).slice(0, NUM_PROMPTS), epoch)
    return epoch


def train_while_scaling(config, metric: str) -> dict[int, dict]:
    """Trains while `scale_one_two_one` asks for 2 replicas, then 1; checks that both requests were made, the run
    trained all its steps and every prompt exactly once; returns its training rows by step."""
    output = Path(config.trainer.output_dir)
    done: list[str] = []
    controller = threading.Thread(target=scale_one_two_one, args=(output, 600, done, metric), daemon=True)
    controller.start()
    summary = train(config)
    controller.join(timeout=10)
    num_steps = NUM_PROMPTS // BATCH
    assert summary["steps"] == num_steps and done == ["grow", "shrink"]
    trained = trained_prompts(output, num_steps)
    assert len(trained) == NUM_PROMPTS and set(trained.values()) == {1}   # every prompt once, none lost
    return training_rows(str(output))


def test_fully_async_grows_to_two_replicas_and_back_while_training(make_raw_config, raw_policy, tmp_path,
                                                                    ray_session):
    config = make_raw_config(*FULLY_ASYNC, f"data.train_files=[{epoch_of(raw_policy, tmp_path)}]",
                             f"data.train_batch_size={BATCH}", f"actor.ppo_mini_batch_size={BATCH}",
                             "async_training.trigger_parameter_sync_step=1", "async_training.staleness_threshold=0",
                             "weight_sync.timeout_s=120")
    rows = train_while_scaling(config, "rollout/num_replicas_in_version")
    # Versions: each step trains on tokens all stamped with the version it trains at.
    for step, samples in dumped(config.trainer.output_dir).items():
        version = int(rows[step]["param_version"])
        assert all(sample["versions"] == [version] for sample in samples), step
    # Phases, from the replicas each version ran with; each phase reports its throughput.
    measured = [row for _, row in sorted(rows.items()) if "rollout/num_replicas_in_version" in row]
    assert phases([row["rollout/num_replicas_in_version"] for row in measured]) == [1.0, 2.0, 1.0]
    assert all(row["rollout/samples_per_replica_s"] > 0 for row in measured)
    assert max(row.get("rollout/num_resizes", 0) for row in rows.values()) == 2
    assert rows[max(rows)]["rollout/num_replicas"] == 1.0


def test_one_step_off_grows_to_two_replicas_and_back_while_training(make_raw_config, raw_policy, tmp_path,
                                                                    ray_session):
    """The driver holds the replica set in one_step_off: the same control, applied at the sync of a step, after the
    batch in flight was collected; the batch dispatched next is spread over the replicas the sync left."""
    config = make_raw_config("trainer.mode=one_step_off", "rollout.n_gpus_per_node=1", "trainer.dump_rollouts=true",
                             "trainer.val_before_train=false", "data.val_files=[]",
                             f"data.train_files=[{epoch_of(raw_policy, tmp_path)}]", f"data.train_batch_size={BATCH}",
                             f"actor.ppo_mini_batch_size={BATCH}")
    rows = train_while_scaling(config, "rollout/num_replicas")
    for step, samples in dumped(config.trainer.output_dir).items():
        assert all(sample["versions"] == [step - 1] for sample in samples), step   # one version stale, always
    assert phases([rows[step]["rollout/num_replicas"] for step in sorted(rows)]) == [1.0, 2.0, 1.0]


def kill_on_every_start(replicas: list, ray_session, after_step: int, output: Path, killed: list[int],
                        stop: threading.Event) -> None:
    """SIGKILLs the first replica's process once step `after_step` is logged, then again each time Ray has
    restarted it (a new process id), until `stop`: it never answers a request again."""
    while last_step(output) < after_step and not stop.is_set():
        time.sleep(0.1)
    while not stop.is_set():
        try:
            pid = ray_session.get(replicas[0].pid.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - down, restarting, or retired: ask again until told to stop
            time.sleep(0.2)
            continue
        if pid not in killed:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)


def test_a_replica_killed_on_every_start_is_retired_and_the_run_finishes_on_the_other(make_raw_config, raw_policy,
                                                                                     tmp_path, ray_session,
                                                                                     monkeypatch):
    config = make_raw_config(*FULLY_ASYNC, f"data.train_files=[{epoch_of(raw_policy, tmp_path)}]",
                             f"data.train_batch_size={BATCH}", f"actor.ppo_mini_batch_size={BATCH}",
                             "rollout.n_gpus_per_node=2",
                             "async_training.trigger_parameter_sync_step=1", "async_training.staleness_threshold=0.5",
                             "rollout.max_replica_failures=2", "rollout.max_replica_restarts=4",
                             "weight_sync.timeout_s=20")
    output = Path(config.trainer.output_dir)
    replicas: list = []
    launch = runtime.launch_replicas

    def launch_and_keep(*args):
        replicas.extend(launch(*args))
        return list(replicas)

    monkeypatch.setattr(runtime, "launch_replicas", launch_and_keep)
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=kill_on_every_start, args=(replicas, ray_session, 1, output, killed, stop),
                              daemon=True)
    killer.start()
    try:
        summary = train(config)
    finally:
        stop.set()
        killer.join(timeout=30)
    assert len(killed) >= 2 and summary["steps"] == NUM_PROMPTS // BATCH
    trained = trained_prompts(output, NUM_PROMPTS // BATCH)
    assert len(trained) == NUM_PROMPTS and set(trained.values()) == {1}
    rows = training_rows(str(output))
    assert max(row.get("faults/replicas_retired", 0) for row in rows.values()) == 1
    assert rows[NUM_PROMPTS // BATCH]["rollout/num_replicas"] == 1.0
