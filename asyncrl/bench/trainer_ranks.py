"""Run a function on N ranks, one spawned process each, and collect what each returns.

    results = run_ranks(measure_rank, 2, folder, bench)   # measure_rank(rank, world_size, port, folder, bench)

The trainer benchmark's launcher for N > 1 ranks (`asyncrl.bench.trainer --world-size N`), and the
trainer tests' (`tests/train/helpers.py::run_in_processes`). Spawned, so the
caller's script needs the `if __name__ == "__main__":` guard; the function must be importable (module level)
and return plain Python data (numbers, strings, lists, dicts): results cross processes pickled, and torch
tensors are never sent. `port` is a free local port for the ranks' process group.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from queue import Empty
from typing import Any, Callable

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(function: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 1800.0,
              num_threads: int | None = None) -> list[Any]:
    """function(rank, world_size, port, *args) in `world_size` spawned processes; their return values, which
    must be plain Python data. A rank that raises or dies stops the others. `num_threads` per rank defaults
    to an equal share of the host's cores."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = free_port()
    num_threads = num_threads or max(1, (os.cpu_count() or 1) // world_size)
    processes = [context.Process(target=rank_entry,
                                 args=(queue, function, rank, world_size, port, num_threads, args))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    try:
        results = collect_ranks(queue, processes, timeout_s)
    except BaseException:
        for process in processes:
            if process.is_alive():
                process.terminate()  # ranks left waiting in a collective for the failed one
        raise
    finally:
        for process in processes:
            process.join(timeout=60)
    return [results[rank] for rank in range(world_size)]


def collect_ranks(queue: Any, processes: list[Any], timeout_s: float) -> dict[int, Any]:
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(results) < len(processes):
        try:
            rank, error, value = queue.get(timeout=5)
        except Empty:
            # Exit code 0 always comes after the result was sent; anything else is a rank that died.
            for rank, process in enumerate(processes):
                if rank not in results and process.exitcode not in (None, 0):
                    raise RuntimeError(f"rank {rank} died (exit code {process.exitcode})") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks {sorted(set(range(len(processes))) - set(results))} "
                                   f"sent no result within {timeout_s:.0f} s") from None
            continue
        if error is not None:
            raise RuntimeError(f"rank {rank} failed:\n{error}")
        results[rank] = value
    return results


def rank_entry(queue: Any, function: Callable[..., Any], rank: int, world_size: int, port: int, num_threads: int,
               args: tuple) -> None:
    torch.set_num_threads(num_threads)
    try:
        queue.put((rank, None, function(rank, world_size, port, *args)))
    except Exception:
        queue.put((rank, traceback.format_exc(), None))
