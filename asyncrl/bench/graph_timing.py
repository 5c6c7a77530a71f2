"""Kernel timing the way the engine runs its decode step: launches captured in a CUDA graph, timed by replay.

Timed from Python instead, a launch of a many-argument Triton kernel costs the host more than the kernel
runs on the GPU (~70 us against ~40 us for the 0.5B decode attention on an H200), so every variant would
measure the launch overhead. `graph_replay_ms` times a kernel the way the engine runs it; `event_ms` times
eager calls, for work of large kernels that queue ahead of the GPU or that a graph cannot hold.
"""

from __future__ import annotations

from typing import Callable

import torch


def graph_replay_ms(launch: Callable[[], object], replays: int = 5) -> float:
    """Milliseconds per replay of one CUDA graph holding everything `launch()` enqueues on the current stream
    (streams it forks from there and joins back included). `launch` runs once before the capture, on a side
    stream, so kernels compile and cuBLAS sets up its workspaces outside the graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / replays


def event_ms(launch: Callable[[], object], warmup: int = 3, repeats: int = 20) -> float:
    """Milliseconds per eager call, by CUDA events around `repeats` back-to-back calls after `warmup` ones. For
    calls of a few large kernels (tens of microseconds or more), which queue ahead of the GPU: the trainer's
    attention (capturing the backward of flash's varlen op in a graph of its own failed with
    cudaErrorStreamCaptureInvalidated; in the whole update it does not), an optimizer step."""
    for _ in range(warmup):
        launch()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        launch()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / repeats
