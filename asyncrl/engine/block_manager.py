"""Allocation of paged KV-cache blocks: a free list and reference counts.

A block holds the KV of `block_size` consecutive positions of one or more sequences. Sequences that
start with the same tokens (the n responses of one prompt, admitted in one prefill) share the prompt's
FULL blocks: the block's reference count says how many block tables list it, and it returns to the free
list when the count drops to 0. A partially filled last prompt block is never shared, because every
response writes its own next tokens into it: each follower gets a private copy, filled during the same
prefill by writing the prompt's tail KV to several slots (see `write_rows` in `attention.py`).
"""

from __future__ import annotations

from collections import deque

from asyncrl.engine.sequence import Sequence


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    """Hands out block ids 0 .. num_blocks - 1 and tracks who uses them."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reference_counts = [0] * num_blocks
        self.free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_block_ids)

    def _take_block(self) -> int:
        block_id = self.free_block_ids.popleft()
        self.reference_counts[block_id] = 1
        return block_id

    def num_blocks_to_allocate(self, sequence: Sequence, leader: Sequence | None) -> int:
        """Blocks `allocate` would take: all of them alone, only a private partial last block with a leader."""
        if leader is None:
            return num_blocks_for(len(sequence), self.block_size)
        return 1 if len(sequence) % self.block_size else 0

    def allocate(self, sequence: Sequence, leader: Sequence | None = None) -> None:
        """Gives `sequence` blocks for all its tokens. With a `leader` holding the same tokens, the leader's
        full blocks are shared and only a partially filled last block is private."""
        if sequence.block_table:
            raise ValueError(f"sequence {sequence.sequence_id} already holds blocks")
        needed = self.num_blocks_to_allocate(sequence, leader)
        if needed > self.num_free_blocks:
            raise ValueError(f"allocate needs {needed} blocks, {self.num_free_blocks} are free")
        if leader is None:
            sequence.assign_blocks([self._take_block() for _ in range(needed)])
            return
        if leader.token_ids != sequence.token_ids:
            raise ValueError(f"sequence {sequence.sequence_id} does not hold the tokens of its leader")
        num_full = len(sequence) // self.block_size
        shared = leader.block_table[:num_full]
        for block_id in shared:
            self.reference_counts[block_id] += 1
        sequence.assign_blocks(shared + [self._take_block() for _ in range(needed)])

    def free(self, sequence: Sequence) -> None:
        """Drops the sequence's references; blocks nobody references any more become free."""
        for block_id in reversed(sequence.block_table):
            self.reference_counts[block_id] -= 1
            if self.reference_counts[block_id] == 0:
                self.free_block_ids.append(block_id)
        sequence.assign_blocks([])

    def needs_new_block(self, sequence: Sequence, lookahead: int = 0) -> bool:
        """Whether the next decode step (writing position len - 1 + lookahead) needs one more block.
        lookahead 1: a decode scheduled before the previous step's token is appended (see `schedule_ahead`)."""
        return len(sequence.block_table) * self.block_size < len(sequence.token_ids) + lookahead

    def can_append(self, sequence: Sequence, lookahead: int = 0) -> bool:
        return self.num_free_blocks > 0 or not self.needs_new_block(sequence, lookahead)

    def append_slot(self, sequence: Sequence, lookahead: int = 0) -> None:
        """Makes sure position len - 1 + lookahead has a block; decode writes only to blocks the sequence owns
        alone."""
        if self.needs_new_block(sequence, lookahead):
            sequence.append_block(self._take_block())
        last_block = sequence.block_table[-1]
        if self.reference_counts[last_block] != 1:
            raise ValueError(f"sequence {sequence.sequence_id} would write into shared block {last_block}")
