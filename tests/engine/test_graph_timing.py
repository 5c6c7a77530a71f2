"""The benchmarks' CUDA-graph timer replays exactly what it captured, forked streams included (needs a GPU:
CUDA graphs do not exist on the CPU)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.bench.graph_timing import graph_replay_ms

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def test_graph_replay_runs_the_launch_once_to_warm_up_then_once_per_replay_with_forked_streams():
    counter = torch.zeros((), device="cuda")
    forked = torch.zeros((), device="cuda")
    side = torch.cuda.Stream()

    def launch() -> None:
        counter.add_(1)
        origin = torch.cuda.current_stream()
        side.wait_stream(origin)
        with torch.cuda.stream(side):
            forked.add_(counter)  # reads what the origin stream wrote before the fork
        origin.wait_stream(side)

    milliseconds = graph_replay_ms(launch, replays=7)
    # Warm-up run, the upload replay and 7 timed replays; the capture itself runs nothing.
    assert counter.item() == 9
    assert forked.item() == sum(range(1, 10))
    assert milliseconds > 0
