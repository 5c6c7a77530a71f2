"""Fault injection: each fault's outcome is asserted, none may hang.

- a rollout replica killed mid-run: Ray restarts it, the trainer re-syncs it, the run finishes and trains
  every prompt once;
- a trainer rank killed: the run stops with one clear line naming it; resuming finishes the epoch with
  every prompt once;
- SIGTERM mid-run: a checkpoint is saved and the process exits cleanly; resuming finishes the run;
- a truncated checkpoint, and one altered without a change of size, are detected and skipped with a message
  naming the file; the newest good one is used; a planted pickle is never loaded;
- a checkpoint from an incompatible config is refused, listing the differing keys;
- a pipeline that stops producing samples is reported by the watchdog with every component's state;
- a trainer port taken between its probe and its bind is retried on a fresh port.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as parquet
import pytest

from asyncrl.config import dump_config
from asyncrl.launch import runtime, train
from asyncrl.recipes.errors import IncompatibleCheckpointError
from asyncrl.recipes.fully_async.trainer import PipelineStalledError
from asyncrl.rollout import resolve_backend
from asyncrl.telemetry import read_metrics
from tests.e2e.replica_killer import ReplicaKiller, last_step


def trained_prompts(output_dir: Path, num_steps: int) -> Counter:
    folder = output_dir / "rollouts"
    return Counter(json.loads(line)["prompt_id"] for step in range(1, num_steps + 1)
                   for line in (folder / f"step_{step}.jsonl").read_text().splitlines()
                   if json.loads(line)["sample_index"] == 0)


@pytest.fixture()
def epoch_file(warm_policy, tmp_path) -> Path:
    """An epoch of 64 prompts: 8 steps of 8."""
    path = tmp_path / "epoch.parquet"
    parquet.write_table(parquet.read_table(warm_policy["train"]).slice(0, 64), path)
    return path


def epoch_config(make_config, epoch_file, *overrides, output="run"):
    return make_config(f"data.train_files=[{epoch_file}]", "data.train_batch_size=8", "actor.ppo_mini_batch_size=8",
                       "trainer.dump_rollouts=true", "trainer.val_before_train=false", "data.val_files=[]",
                       *overrides, output=output)


def test_killed_rollout_replica_is_restarted_resynced_and_the_run_finishes(make_config, epoch_file, ray_session,
                                                                            monkeypatch):
    config = epoch_config(make_config, epoch_file, "trainer.mode=fully_async", "rollout.n_gpus_per_node=1",
                          "async_training.trigger_parameter_sync_step=2", "async_training.staleness_threshold=0.5",
                          "async_training.partial_rollout=true", "weight_sync.timeout_s=20")
    output = Path(config.trainer.output_dir)
    killer = ReplicaKiller(monkeypatch, ray_session, output, after_step=2, timeout_s=240)
    summary = train(config)
    killer.join()
    killed = killer.killed
    assert len(killed) == 1  # this run's replica process was killed
    assert summary["steps"] == 8
    trained = trained_prompts(output, 8)
    assert len(trained) == 64 and set(trained.values()) == {1}
    rows = read_metrics(output / "metrics.jsonl")
    # Killed during a sync (the trainer re-forms the group) or while generating (the rollouter re-queues).
    assert max(row.get("faults/replica_restarts", 0) + row.get("faults/replica_failures", 0) for row in rows) >= 1
    assert max(row.get("faults/replica_restarts", 0) for row in rows) == 1


def run_cli(config_path: Path, log_path: Path) -> subprocess.Popen:
    """`asyncrl train` in a session of its own; its log (stderr) goes to `log_path`, readable while it runs."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    with log_path.open("w") as log:
        return subprocess.Popen([sys.executable, "-m", "asyncrl.cli", "train", str(config_path)], env=env,
                                stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)


def wait_for_step(process: subprocess.Popen, output: Path, log_path: Path, step: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while last_step(output) < step:
        assert process.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "the run did not reach the step in time"
        time.sleep(0.1)


def logged_pid(log_path: Path, worker: str) -> int:
    """The process id the run logged at start for `worker` (asked of its actor), e.g. trainer/rank0."""
    match = re.search(rf"processes: .*\b{re.escape(worker)} pid (\d+)", log_path.read_text())
    assert match, f"the run logged no process id for {worker}"
    return int(match.group(1))


def test_killed_trainer_rank_stops_the_run_clearly_and_resume_finishes_the_epoch(make_config, epoch_file, tmp_path):
    config = epoch_config(make_config, epoch_file, "trainer.save_freq=1", "ray.num_cpus=2")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(dump_config(config))
    output = Path(config.trainer.output_dir)
    process = run_cli(config_path, tmp_path / "first.log")
    wait_for_step(process, output, tmp_path / "first.log", 3)
    os.kill(logged_pid(tmp_path / "first.log", "trainer/rank0"), signal.SIGKILL)
    process.communicate(timeout=300)
    stderr = (tmp_path / "first.log").read_text()
    assert process.returncode == 1, stderr[-3000:]
    assert "error: trainer/rank0 died" in stderr and "trainer.resume=auto" in stderr
    assert "Traceback" not in stderr
    resumed = run_cli(config_path, tmp_path / "resumed.log")
    resumed.communicate(timeout=600)
    assert resumed.returncode == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    trained = trained_prompts(output, 8)
    assert len(trained) == 64 and set(trained.values()) == {1}


def test_sigterm_saves_a_checkpoint_and_exits_cleanly_then_resume_finishes(make_config, epoch_file, tmp_path):
    config = epoch_config(make_config, epoch_file, "trainer.mode=one_step_off", "rollout.n_gpus_per_node=1",
                          "ray.num_cpus=2")
    config_path = tmp_path / "run.yaml"
    config_path.write_text(dump_config(config))
    output = Path(config.trainer.output_dir)
    process = run_cli(config_path, tmp_path / "first.log")
    wait_for_step(process, output, tmp_path / "first.log", 2)
    os.kill(process.pid, signal.SIGTERM)
    stdout, _ = process.communicate(timeout=300)
    assert process.returncode == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert "stopped by SIGTERM after" in stdout
    stopped_at = int(stdout.split("stopped by SIGTERM after step ")[1].split()[0])
    assert (output / "checkpoints" / f"step_{stopped_at}" / "driver.json").is_file()
    resumed = run_cli(config_path, tmp_path / "resumed.log")
    resumed.communicate(timeout=600)
    assert resumed.returncode == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    steps = [row["step"] for row in read_metrics(output / "metrics.jsonl") if "critic/score/mean" in row]
    assert steps == list(range(1, 9))
    trained = trained_prompts(output, 8)
    assert len(trained) == 64 and set(trained.values()) == {1}


def test_truncated_checkpoint_is_skipped_and_an_incompatible_one_refused(make_config, epoch_file, ray_session,
                                                                       caplog):
    """Step 3's trainer shard is truncated (a crash mid-write) and step 2's altered without changing its size (a
    bad disk): both are skipped naming the file, and the run resumes from step 1. A pickle planted in a
    checkpoint is never loaded: that checkpoint is skipped naming the file, and the payload does not run."""
    first = epoch_config(make_config, epoch_file, "trainer.save_freq=1", "trainer.total_steps=3")
    train(first)
    output = Path(first.trainer.output_dir)
    truncated = output / "checkpoints" / "step_3" / "trainer" / "rank_0.safetensors"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    altered = output / "checkpoints" / "step_2" / "trainer" / "rank_0.safetensors"
    data = bytearray(altered.read_bytes())
    data[len(data) // 2] ^= 0x01
    altered.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING, logger="asyncrl")
    summary = train(epoch_config(make_config, epoch_file, "trainer.save_freq=1", "trainer.total_steps=4"))
    assert (summary["last_step"], summary["resumed_from_step"], summary["steps"]) == (4, 1, 3)
    skipped = [record.message for record in caplog.records if "skipping checkpoint" in record.message]
    assert any("step_3" in message and "trainer/rank_0.safetensors has" in message and "truncated" in message
               for message in skipped), skipped
    assert any("step_2" in message and "trainer/rank_0.safetensors does not match its SHA-256" in message
               for message in skipped), skipped
    steps = [row["step"] for row in read_metrics(output / "metrics.jsonl") if "critic/score/mean" in row]
    assert steps == [1, 2, 3, 4]  # steps 2-4 were redone from step 1's checkpoint, their old lines replaced
    marker = output.parent / "planted_pickle_ran"
    (output / "checkpoints" / "step_4" / "trainer" / "rank_0.pt").write_bytes(
        b"cos\nsystem\n(Vtouch " + str(marker).encode() + b"\ntR.")  # pickle protocol 0: os.system("touch ...")
    caplog.clear()
    with pytest.raises(IncompatibleCheckpointError, match=r"rollout\.n: 8 in the checkpoint, 4 now"):
        train(epoch_config(make_config, epoch_file, "rollout.n=4", "trainer.total_steps=6"))
    assert any("step_4" in record.message and "trainer/rank_0.pt was not written with the checkpoint" in record.message
               for record in caplog.records)
    assert not marker.exists()


def test_a_stalled_pipeline_is_reported_by_the_watchdog_with_every_component_state(make_config, epoch_file,
                                                                                  tmp_path, ray_session):
    sleep_s = 60
    slept = tmp_path / "sleeps_started"   # one wall-clock time a line, written as each scoring call starts to sleep
    reward_file = tmp_path / "slow.py"  # scoring stalls (within its timeout): no sample reaches the queue
    reward_file.write_text("import time\n\n"
                           "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                           f"    with open({str(slept)!r}, 'a') as log:\n"
                           "        log.write(f'{time.time()}\\n')\n"
                           f"    time.sleep({sleep_s})\n"
                           "    return 0.0\n")
    config = epoch_config(make_config, epoch_file, "trainer.mode=fully_async", "rollout.n_gpus_per_node=1",
                          f"reward.custom_function={reward_file}:compute_score", f"reward.timeout_s={2 * sleep_s}",
                          "ray.watchdog_s=3")
    with pytest.raises(PipelineStalledError) as raised:
        train(config)
    reported = time.time()
    message = str(raised.value)
    assert "no sample reached the trainer" in message and "ray.watchdog_s=3" in message
    assert "'trainer': {'step': 0" in message and "'queue': {" in message and "'rollouter': {" in message
    # Reported while the reward function still sleeps, not after it: timed from the first sleep, not from the
    # start of the run, whose start-up a loaded machine stretches to minutes.
    if slept.exists():   # else the watchdog fired before any scoring began, which is sooner still
        assert reported < min(map(float, slept.read_text().split())) + sleep_s


def test_a_trainer_port_taken_between_probe_and_bind_is_retried_on_a_fresh_one(make_config, ray_session, caplog,
                                                                                monkeypatch):
    config = make_config()
    with socket.socket() as taken, socket.socket() as probe:
        taken.bind(("", 0))
        taken.listen()  # someone else listens on the port the probe found free
        probe.bind(("127.0.0.1", 0))
        ports = [taken.getsockname()[1], probe.getsockname()[1]]
        probe.close()

        class ProbedAddresses:  # stands in for the remote `node_address` probe: the taken port, then a free one
            def options(self, **_):
                return self

            def remote(self):
                return ray_session.put(("127.0.0.1", ports.pop(0)))

        monkeypatch.setattr(runtime, "node_address", ProbedAddresses())
        caplog.set_level(logging.WARNING, logger="asyncrl")
        pools = runtime.allocate_pools(runtime.pool_specs(config, resolve_backend(config)))
        try:
            group = runtime.start_trainers(config, pools, total_steps=1, host_engine=False)
            assert ports == []  # both addresses were used
            assert any("was taken before rank 0 bound it; retrying" in record.message for record in caplog.records)
            assert ray_session.get(group.actors[0].ping.remote()) == 0
            for actor in group.actors:
                ray_session.kill(actor)
        finally:
            pools.release()
