"""Allocation of paged KV-cache blocks: free blocks, reference counts and the prefix cache.

A block holds the KV of `block_size` consecutive positions of one or more sequences. Sequences that
start with the same tokens (the n responses of one prompt, admitted in one prefill) share the prompt's
FULL blocks: the block's reference count says how many block tables list it, and it is released when the
count drops to 0. A partially filled last prompt block is never shared, because every response writes its
own next tokens into it: each follower gets a private copy, filled during the same prefill by writing the
prompt's tail KV to several slots (see `write_rows` in `attention.py`).

Prefix cache (`enable_prefix_caching`): a full block whose KV has been computed is registered under the
hash of its tokens and of every token before it (`Sequence.block_hashes`): a prefill's blocks when it is
launched, a sequence's decode-filled blocks when it is released (unless the weights changed while it ran: then
its KV mixes both). A later sequence starting with the same
full blocks (a group's sample admitted in another step, an agent's next turn, a preempted or resumed
request) takes them instead of computing them again. A released registered block keeps its KV and stays
findable until its memory is needed: blocks that never held a registered prefix are handed out first, then
registered ones, least recently released first. The cache holds KV of the current weights only:
`clear_prefix_cache` forgets every registration when the weights change or the cache memory goes.

Reused KV is what a recompute would give up to rounding: a decode step computes its row's KV in a one-row
product and a prefill of another length pads attention differently, which on CPU changes the last bits, as
batch composition does anyway (a group's samples, which reuse prompt blocks of a prefill of the same length,
are bitwise those of a recompute on the development VM's CPU in fp32).
"""

from __future__ import annotations

from collections import OrderedDict, deque

from asyncrl.engine.sequence import Sequence


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockManager:
    """Hands out block ids 0 .. num_blocks - 1 and tracks who uses them."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 min_computed_tokens: int = 1) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # A prefix hit leaves at least this many tokens to compute (see `cached_prefix`).
        self.min_computed_tokens = min_computed_tokens
        self.reference_counts = [0] * num_blocks
        self.free_block_ids: deque[int] = deque(range(num_blocks))  # free and holding no registered prefix
        self.evictable: OrderedDict[int, None] = OrderedDict()  # free, registered: least recently released first
        self.block_of_hash: dict[int, int] = {}
        self.hash_of_block: dict[int, int] = {}
        self.epoch = 0  # counts `clear_prefix_cache` calls: KV computed in an earlier epoch is never registered

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids) + len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, in use or not."""
        return len(self.block_of_hash)

    def _take_block(self) -> int:
        if self.free_block_ids:
            block_id = self.free_block_ids.popleft()
        else:
            block_id, _ = self.evictable.popitem(last=False)
            del self.block_of_hash[self.hash_of_block.pop(block_id)]
        self.reference_counts[block_id] = 1
        return block_id

    def _reference(self, block_id: int) -> None:
        if self.reference_counts[block_id] == 0:
            del self.evictable[block_id]
        self.reference_counts[block_id] += 1

    def cached_prefix(self, sequence: Sequence) -> list[int]:
        """The registered blocks holding the longest prefix of `sequence`'s full blocks, leaving at least
        `min_computed_tokens` of its tokens to compute (at least its last: its hidden state samples the next
        token); empty without the prefix cache."""
        if not self.enable_prefix_caching or not self.block_of_hash:
            return []
        blocks = []
        num_blocks = max(len(sequence) - max(self.min_computed_tokens, 1), 0) // self.block_size
        for block_hash in sequence.block_hashes(self.block_size, num_blocks):
            block_id = self.block_of_hash.get(block_hash)
            if block_id is None:
                break
            blocks.append(block_id)
        return blocks

    def num_blocks_to_allocate(self, sequence: Sequence, leader: Sequence | None,
                               cached: list[int] | None = None) -> int:
        """Free blocks `allocate` would take: all of them alone (less the `cached` prefix blocks that are in use
        anyway), only a private partial last block with a leader."""
        if leader is None:
            cached = cached or []
            unused = sum(self.reference_counts[block_id] == 0 for block_id in cached)
            return num_blocks_for(len(sequence), self.block_size) - len(cached) + unused
        return 1 if len(sequence) % self.block_size else 0

    def allocate(self, sequence: Sequence, leader: Sequence | None = None, cached: list[int] | None = None) -> None:
        """Gives `sequence` blocks for all its tokens: the `cached` prefix blocks (from `cached_prefix`) first,
        then new ones. With a `leader` holding the same tokens, the leader's full blocks are shared and only a
        partially filled last block is private."""
        if sequence.block_table:
            raise ValueError(f"sequence {sequence.sequence_id} already holds blocks")
        needed = self.num_blocks_to_allocate(sequence, leader, cached)
        if needed > self.num_free_blocks:
            raise ValueError(f"allocate needs {needed} blocks, {self.num_free_blocks} are free")
        if leader is None:
            cached = cached or []
            for block_id in cached:
                self._reference(block_id)
            fresh = num_blocks_for(len(sequence), self.block_size) - len(cached)
            sequence.assign_blocks(cached + [self._take_block() for _ in range(fresh)])
            sequence.admitted(len(cached) * self.block_size)
            return
        if leader.token_ids != sequence.token_ids:
            raise ValueError(f"sequence {sequence.sequence_id} does not hold the tokens of its leader")
        num_full = len(sequence) // self.block_size
        shared = leader.block_table[:num_full]
        for block_id in shared:
            self._reference(block_id)
        sequence.assign_blocks(shared + [self._take_block() for _ in range(needed)])
        sequence.admitted(leader.num_cached_tokens)

    def register(self, sequence: Sequence, num_tokens: int) -> None:
        """Registers the full blocks among `sequence`'s first `num_tokens` positions, whose KV is computed (or is
        being computed by a launched step, which every later step runs after)."""
        if not self.enable_prefix_caching:
            return
        num_full = min(num_tokens // self.block_size, len(sequence.block_table))
        for block_hash, block_id in zip(sequence.block_hashes(self.block_size, num_full), sequence.block_table):
            if block_hash not in self.block_of_hash and block_id not in self.hash_of_block:
                self.block_of_hash[block_hash] = block_id
                self.hash_of_block[block_id] = block_hash

    def clear_prefix_cache(self) -> None:
        """Forgets every registered prefix (their KV no longer matches the weights, or is gone); sequences in flight
        hold KV of the old weights and will not register it when released."""
        self.epoch += 1
        for block_id in self.evictable:
            self.free_block_ids.append(block_id)
        self.evictable.clear()
        self.block_of_hash.clear()
        self.hash_of_block.clear()

    def free(self, sequence: Sequence) -> None:
        """Drops the sequence's references; blocks nobody references any more are released (registered ones stay
        findable until their memory is needed). Its full blocks with computed KV (every position but the last
        token's) are registered first, so an agent's next turn or a readmission finds them."""
        if sequence.kv_epoch == self.epoch:  # its KV all computed by the current weights
            self.register(sequence, len(sequence) - 1)
        sequence.kv_epoch = None
        for block_id in reversed(sequence.block_table):
            self.reference_counts[block_id] -= 1
            if self.reference_counts[block_id] == 0:
                if block_id in self.hash_of_block:
                    self.evictable[block_id] = None
                else:
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
