"""Why a trainer process's host-side CPU ops sometimes stall: one process, the graphed 0.5B update, and the
host's batch selection timed alone, then again with one intra-op thread and with a shorter GIL switch interval.
Prints every Python thread's innermost frames too.

    python benchmarks/trainer_host_stalls.py
"""

import os
import sys
import time
import traceback

import torch

from asyncrl.bench.trainer import update_setup


def time_selects(batch, repeats: int = 20) -> float:
    rows = torch.arange(4)
    started = time.perf_counter()
    for _ in range(repeats):
        batch.select(rows)
    return (time.perf_counter() - started) / repeats


def time_updates(worker, batch, spec, repeats: int = 3) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        worker.update_actor(batch, spec)
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    print(f"threads {torch.get_num_threads()}, affinity {len(os.sched_getaffinity(0))} cpus, switch interval "
          f"{sys.getswitchinterval()}", flush=True)
    for path in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        if os.path.exists(path):
            print(path, open(path).read().strip())
    worker, batch, spec = update_setup("qwen2.5-0.5b", 4096, 1024, 8, False, "cuda", total_steps=20, cuda_graphs=True)
    print(f"select before any update: {time_selects(batch) * 1e3:.2f} ms", flush=True)
    worker.update_actor(batch, spec)
    print(f"default: select {time_selects(batch) * 1e3:.2f} ms, update {time_updates(worker, batch, spec):.3f} s")
    frames = sys._current_frames()
    import threading
    for thread in threading.enumerate():
        frame = frames.get(thread.ident)
        stack = "" if frame is None else " <- ".join(
            f"{entry.name}({os.path.basename(entry.filename)}:{entry.lineno})"
            for entry in reversed(traceback.extract_stack(frame)[-4:]))
        print(f"  thread {thread.name} daemon={thread.daemon}: {stack}")
    torch.set_num_threads(1)
    print(f"1 thread: select {time_selects(batch) * 1e3:.2f} ms, update {time_updates(worker, batch, spec):.3f} s")
    torch.set_num_threads(16)
    sys.setswitchinterval(0.0002)
    print(f"switch 0.2 ms: select {time_selects(batch) * 1e3:.2f} ms, update {time_updates(worker, batch, spec):.3f} s")


if __name__ == "__main__":
    main()
