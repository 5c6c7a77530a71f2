"""Weight-sync speed: trainer (FSDP2, one device) -> engine (another device), next to a raw broadcast.

    python -m asyncrl.bench.sync --models qwen2.5-0.5b qwen2.5-1.5b --bucket-mb 256
    python -m asyncrl.bench.sync --models tiny-test --device cpu        # smoke test on CPU (gloo)

Two processes: process 0 holds a `TrainerWorker` (fp32 master weights, FSDP2) on device 0, process 1 an
`LLMEngine` on device 1. A sync is the real path: gather full tensors, cast to the engine dtype, pack
into buckets, broadcast, load in place. The raw baseline broadcasts the same number of bytes as one
buffer over the same group. Effective bandwidth = bytes of the engine's weights / sync time. The
breakdown times each side's local work alone: the trainer's gather + cast, the engine's in-place load.
Each model's result is appended as one JSON line to `--output` (default `outputs/bench/sync.jsonl`).
"""

from __future__ import annotations

import argparse
import hashlib
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch.multiprocessing as mp

from asyncrl.bench.models import write_random_model
from asyncrl.bench.results import append_result, default_output
from asyncrl.config import load_config
from asyncrl.engine import EngineConfig, LLMEngine
from asyncrl.rollout.weight_group import transfer_plan
from asyncrl.rollout.weight_transport import WeightReceiver, WeightSender, broadcast, create_group
from asyncrl.train import TrainerWorker
from asyncrl.train.parallel import local_shard


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha1(tensor.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def best_time(work: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The fastest of `repeats` timed runs of `work`, after one that warms up."""
    times = []
    for _ in range(repeats + 1):
        synchronize(device)
        started = time.perf_counter()
        work()
        synchronize(device)
        times.append(time.perf_counter() - started)
    return min(times[1:])


def run_side(rank: int, folder: str, device_type: str, bucket_mb: int, repeats: int, ports: tuple[int, int],
             queue) -> None:
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    config = load_config(None, [f"model.path={folder}", f"trainer.device={device_type}", "rollout.n=2",
                                f"weight_sync.bucket_mb={bucket_mb}", "rollout.gpu_memory_utilization=0.3"])
    engine_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    plan = transfer_plan(config, engine_dtype)
    if rank == 0:
        worker = TrainerWorker(config, 0, 1, "127.0.0.1", ports[0], total_training_steps=1)
    else:
        engine = LLMEngine(folder, EngineConfig.from_rollout(config.rollout, device=str(device), num_kv_blocks=64))
        copies = [(name, parameter.detach().clone()) for name, parameter in engine.runner.model.named_parameters()]
    group = create_group("127.0.0.1", ports[1], rank, 2, device, timeout_s=300)
    raw = torch.empty(plan.total_bytes, dtype=torch.uint8, device=device)
    # Made once per weight group, as the trainer and the replicas do (the copy views are computed once).
    sender = WeightSender(group, plan, device) if rank == 0 else None
    receiver = WeightReceiver(group, plan, device) if rank == 1 else None

    def sync(version: int) -> None:
        if rank == 0:
            sender.send(worker.iter_sync_tensors(), persistent=worker.sync_tensors_persist)
        else:
            engine.update_weights_in_place(receiver.receive_into, version)

    sync_s = best_time(lambda: sync(1), device, repeats)
    raw_s = best_time(lambda: broadcast(group, raw).wait(), device, repeats)

    def local_work() -> None:
        """Where the time goes: each side's local work alone, without the link."""
        if rank == 0:
            for _, tensor in worker.iter_sync_tensors():
                tensor.to(engine_dtype)  # the gather and cast a sync does, without packing
        else:
            engine.update_weights(copies, version=1)

    local_s = best_time(local_work, device, repeats)
    # The check: after the syncs above, every engine tensor is bitwise the trainer's master weight cast to
    # the engine dtype (digests computed on each side independently of the sync path).
    # The trainer's weights are moved first, so an engine still holding the model folder's weights fails it.
    if rank == 0:
        with torch.no_grad():
            for parameter in worker.actor.model.parameters():
                local_shard(parameter).add_(torch.randn_like(local_shard(parameter)), alpha=1e-2)
        sync(2)
        digests = {name: digest(tensor.to(engine_dtype)) for name, tensor in worker.iter_policy_tensors()}
        queue.put({"gather_s": local_s, "trainer_digests": digests})
    if rank == 1:
        sync(2)
        digests = {name: digest(parameter) for name, parameter in engine.runner.model.named_parameters()}
        queue.put({"engine_digests": digests, "load_s": local_s, "bytes": plan.total_bytes,
                   "sync_s": sync_s, "raw_s": raw_s,
                   "sync_gb_per_s": plan.total_bytes / sync_s / 1e9, "raw_gb_per_s": plan.total_bytes / raw_s / 1e9,
                   "fraction_of_raw": raw_s / sync_s, "buckets": plan.num_buckets})


def run_sync_benchmark(model: str, device: str = "cuda", bucket_mb: int = 256, repeats: int = 5) -> dict:
    folder = write_random_model(model, Path(tempfile.mkdtemp()) / model)
    context = mp.get_context("spawn")
    queue = context.Queue()
    ports = (free_port(), free_port())
    processes = [context.Process(target=run_side, args=(rank, str(folder), device, bucket_mb, repeats, ports, queue))
                 for rank in range(2)]
    for process in processes:
        process.start()
    result = {**queue.get(timeout=900), **queue.get(timeout=900)}
    trainer, engine = result.pop("trainer_digests"), result.pop("engine_digests")
    result["bitwise_equal"] = all(engine[name] == trainer[name] for name in engine) and len(engine) > 0
    for process in processes:
        process.join(timeout=60)
    return {"model": model, "device": device, "bucket_mb": bucket_mb, **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--bucket-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default=default_output("sync.jsonl"),
                        help="append each model's result to this JSON-lines file (default outputs/bench/sync.jsonl)")
    options = parser.parse_args(argv)
    print(f"{'model':16s} {'MB':>8s} {'sync s':>8s} {'GB/s':>7s} {'raw s':>8s} {'raw GB/s':>9s} {'of raw':>7s} "
          f"{'gather s':>9s} {'load s':>8s} {'bitwise':>8s}")
    for model in options.models:
        result = run_sync_benchmark(model, options.device, options.bucket_mb, options.repeats)
        print(f"{model:16s} {result['bytes'] / 1e6:8.1f} {result['sync_s']:8.4f} {result['sync_gb_per_s']:7.1f} "
              f"{result['raw_s']:8.4f} {result['raw_gb_per_s']:9.1f} {result['fraction_of_raw']:7.0%} "
              f"{result['gather_s']:9.4f} {result['load_s']:8.4f} {str(result['bitwise_equal']):>8s}")
        append_result(options.output, result)
    print(f"appended the results to {Path(options.output).resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
