"""A trainer micro-batch step replayed from CUDA graphs, one graph per capacity of its static inputs.

    graphs = StepGraphs(step, device, capture=device.type == "cuda")
    outputs = graphs.run(key, packed, spec)   # packed: a PackedMicroBatch of the key's capacity, on the host;
                                              # spec: constants baked into the graph, so part of the key

Why. A 0.5B model's 4,096-token micro-batch is ~3,500 kernels forward and backward; queuing them from Python
(autograd, compiled-graph wrappers, hooks) takes longer than the GPU takes to run them, which leaves the update
host-bound at ~15% MFU on an H200. A replayed graph queues them all in one call.

The first micro-batch of a key runs `step` eagerly (it is that micro-batch's real work, and it warms up
compilation, autotuning and cuBLAS workspaces) and then captures it; capture runs nothing, so no gradient is
added twice. Later micro-batches of the key copy their inputs into the captured buffers and replay. All graphs
share one memory pool: they never run concurrently. The outputs of a replay are the graph's own tensors, which
the next replay of any graph overwrites: read them (queue work on them) before the next `run`. Without
`capture` (CPU) every call runs `step` on the buffers, the same code path minus the graph.

`step` must be capturable: no host synchronisation (`.item()`, `nonzero`, a Python branch on a tensor), no
host-to-device copy of pageable memory, the same shapes and Python values every call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import torch

from asyncrl.train.fast.packed_batch import PackedBuffers, PackedMicroBatch

Outputs = TypeVar("Outputs")
logger = logging.getLogger(__name__)


class StepGraphs(Generic[Outputs]):
    def __init__(self, step: Callable[..., Outputs], device: torch.device, capture: bool) -> None:
        self.step = step
        self.device = device
        self.capture = capture
        self.buffers: dict[Hashable, PackedBuffers] = {}
        self.graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, Outputs]] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        # One side stream for every warm-up: the allocator caches a stream's freed blocks for that stream only,
        # so a fresh stream per capacity would keep one more step's activations cached each time.
        self.warmup_stream = torch.cuda.Stream(device) if capture else None

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    def run(self, key: Hashable, packed: PackedMicroBatch, *constants: Any) -> Outputs:
        if key not in self.buffers:
            self.buffers[key] = PackedBuffers(packed, self.device)
        self.buffers[key].load(packed)
        buffers = self.buffers[key].batch
        if not self.capture:
            return self.step(buffers, *constants)
        if key in self.graphs:
            graph, outputs = self.graphs[key]
            graph.replay()
            return outputs
        # This micro-batch's real work, and the warm-up, on a side stream as capture wants (work queued lazily
        # on the capturing stream, such as a library's first-use setup, would otherwise end up in the graph).
        main = torch.cuda.current_stream(self.device)
        self.warmup_stream.wait_stream(main)
        with torch.cuda.stream(self.warmup_stream):
            outputs = self.step(buffers, *constants)
        main.wait_stream(self.warmup_stream)
        started = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                captured = self.step(buffers, *constants)
        except RuntimeError as error:
            raise RuntimeError(
                f"actor.cuda_graphs: capturing the update step of {buffers.num_tokens} packed tokens failed "
                f"({error}); an operation in it synchronises with the host or is not capturable. Set "
                f"actor.cuda_graphs=false to train without graphs") from error
        self.graphs[key] = (graph, captured)
        # A run needs one graph per capacity it meets; this says how many, and what each costs to capture.
        rows, width = buffers.response_mask.shape
        logger.info("actor.cuda_graphs: captured update graph %d (%d packed tokens, %d rows x %d response columns, "
                    "%d trained tokens) in %.2f s", self.num_graphs, buffers.num_tokens, rows, width,
                    buffers.target_ids.shape[0], time.perf_counter() - started)
        return outputs
