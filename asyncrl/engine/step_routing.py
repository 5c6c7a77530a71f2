"""Files the experts an MoE step computed into its sequences' routing logs (`routing_log.py`).

    record_step_routing(batch, output.routing())     # in `LLMEngine._postprocess`, before tokens are appended
"""

from __future__ import annotations

import numpy as np

from asyncrl.engine.scheduler import ScheduledBatch


def record_step_routing(batch: ScheduledBatch, routed: np.ndarray) -> None:
    """Files one step's experts (N, L, k), in the order the step computed its tokens, into its sequences' logs.
    Call before the step's sampled tokens are appended. A prefill computed each group leader's tokens from
    position 0 (its followers hold the same tokens); a decode computed each sequence's last token."""
    if batch.is_prefill:
        start = 0
        for index, sequence in enumerate(batch.sequences):
            if batch.leader_indices[index] == index:
                sequence.routing.record(0, routed[start:start + len(sequence)])
                start += len(sequence)
        for index, sequence in enumerate(batch.sequences):
            leader = batch.sequences[batch.leader_indices[index]]
            if leader is not sequence:
                sequence.routing.record(0, leader.routing.as_array(len(leader))[:len(sequence)])
        return
    for row, sequence in enumerate(batch.sequences):
        if not sequence.is_finished:  # a decode ahead still computes one token for a sequence that stopped
            sequence.routing.record(len(sequence) - 1, routed[row:row + 1])
