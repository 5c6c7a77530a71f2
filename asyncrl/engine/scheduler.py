"""Continuous batching: which sequences run in the next step.

Each step is a prefill or a decode:
- prefill: admit waiting sequences in order while `max_num_seqs`, `max_num_batched_tokens` and free
  blocks allow; every admitted sequence is computed from the end of its cached prefix (position 0 without
  the prefix cache; see `block_manager.py`), fresh or recomputed after a preemption. Waiting sequences with
  exactly the same tokens (the n responses of one prompt) form a group: the tokens are computed once for
  the first one, the leader, and the others share its full blocks. The full blocks a prefill computes are
  registered in the prefix cache once it is launched (`prefill_launched`), so a sequence never finds blocks
  its own step is still to write, nor blocks of a batch that never ran.
  The first sequence of a step is admitted even if it alone exceeds `max_num_batched_tokens`. While
  sequences are running, admission leaves 1% of the blocks free for their next tokens, so that a
  sequence just preempted is not readmitted at once only to be preempted again.
- decode: one new token for every running sequence. When no block is free for a sequence's next token,
  the most recently admitted sequence is preempted by recompute: its blocks are freed and it goes back to
  the front of the waiting queue with its generated tokens kept.
- decode ahead (async scheduling): the decode after a decode whose tokens are still on the device, for the
  same sequences, when it cannot differ from what `schedule` would pick once those tokens are known: nothing
  waits for admission and every sequence gets its next block without preemption. Sequences that will
  finish by length are left out; one that stops on a sampled stop token computes one wasted token.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from asyncrl.engine.block_manager import BlockManager
from asyncrl.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    """One step's work. sequences (S): one sampled token each. leader_indices (S): for a prefill, the index
    in `sequences` of the sequence whose computed tokens this one reuses (its own index for a leader); for
    a decode, every sequence is its own leader."""

    sequences: list[Sequence]
    leader_indices: list[int]
    is_prefill: bool
    # A decode scheduled ahead: the row in the previous batch of each sequence, whose sampled token (still on
    # the device) is its input; its tokens so far lack that token, so it computes position len(sequence).
    source_rows: list[int] | None = None

    @property
    def lookahead(self) -> int:
        """Tokens each sequence holds beyond `len(sequence)` when this batch runs: 1 for a decode ahead."""
        return 0 if self.source_rows is None else 1

    @property
    def num_sequences(self) -> int:
        return len(self.sequences)


class Scheduler:
    """Waiting and running queues over one `BlockManager`."""

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 eos_token_ids: frozenset[int], max_model_len: int) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()  # in admission order: the last one is preempted first
        self.num_preemptions = 0
        self.watermark_blocks = block_manager.num_blocks // 100

    def add(self, sequence: Sequence) -> None:
        self.waiting.append(sequence)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        """The next step's batch, or None when nothing is waiting or running."""
        batch = self._schedule_prefill()
        if batch is None and self.running:
            batch = self._schedule_decode()
        return batch

    def _schedule_prefill(self) -> ScheduledBatch | None:
        sequences: list[Sequence] = []
        leader_indices: list[int] = []
        leader_by_tokens: dict[tuple[int, ...], int] = {}
        num_batched_tokens = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            sequence = self.waiting[0]
            key = tuple(sequence.token_ids)
            leader_index = leader_by_tokens.get(key)
            leader = sequences[leader_index] if leader_index is not None else None
            cached = self.block_manager.cached_prefix(sequence) if leader is None else []
            num_new_tokens = 0 if leader is not None else len(sequence) - len(cached) * self.block_manager.block_size
            if sequences and num_batched_tokens + num_new_tokens > self.max_num_batched_tokens:
                break
            reserved = self.watermark_blocks if self.running else 0
            needed = self.block_manager.num_blocks_to_allocate(sequence, leader, cached)
            if needed > self.block_manager.num_free_blocks - reserved:
                break
            self.block_manager.allocate(sequence, leader, cached)
            self.waiting.popleft()
            sequence.status = SequenceStatus.RUNNING
            self.running.append(sequence)
            if leader_index is None:
                leader_index = len(sequences)
                leader_by_tokens[key] = leader_index
            sequences.append(sequence)
            leader_indices.append(leader_index)
            num_batched_tokens += num_new_tokens
        return ScheduledBatch(sequences, leader_indices, is_prefill=True) if sequences else None

    def prefill_launched(self, batch: ScheduledBatch) -> None:
        """Registers the full blocks `batch`, a prefill now queued on the device, computes: later steps run after
        it and may read them."""
        for sequence in batch.sequences:
            sequence.kv_epoch = self.block_manager.epoch
            self.block_manager.register(sequence, len(sequence))

    def _schedule_decode(self) -> ScheduledBatch:
        scheduled: list[Sequence] = []
        while self.running:
            sequence = self.running.popleft()
            while not self.block_manager.can_append(sequence):
                if not self.running:
                    # Alone and still no room: only possible when the cache cannot hold one sequence, which
                    # `LLMEngine.add_request` rules out; recompute it later rather than write out of bounds.
                    self._preempt(sequence)
                    break
                self._preempt(self.running.pop())
            else:
                self.block_manager.append_slot(sequence)
                scheduled.append(sequence)
        self.running.extendleft(reversed(scheduled))
        return ScheduledBatch(scheduled, list(range(len(scheduled))), is_prefill=False)

    def schedule_ahead(self, batch: ScheduledBatch) -> ScheduledBatch | None:
        """The decode after `batch`, a launched decode not yet postprocessed, or None when it depends on
        `batch`'s tokens: sequences are waiting (admission comes first) or blocks would run short (preemption
        decides). Takes the blocks of the positions it writes."""
        if batch.is_prefill or self.waiting:
            return None
        rows = [row for row, sequence in enumerate(batch.sequences) if sequence.status is SequenceStatus.RUNNING
                and len(sequence.token_ids) + 1 < sequence.length_limit(self.max_model_len)]
        sequences = [batch.sequences[row] for row in rows]
        # The others write into the last block they already wrote to in `batch`, which they own alone.
        crossing = [sequence for sequence in sequences if self.block_manager.needs_new_block(sequence, lookahead=1)]
        if not sequences or len(crossing) > self.block_manager.num_free_blocks:
            return None
        for sequence in crossing:
            self.block_manager.append_slot(sequence, lookahead=1)
        return ScheduledBatch(sequences, list(range(len(sequences))), is_prefill=False, source_rows=rows)

    def _preempt(self, sequence: Sequence) -> None:
        self.block_manager.free(sequence)
        sequence.status = SequenceStatus.WAITING
        sequence.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(sequence)

    def preempt_all(self) -> None:
        """Sends every running sequence back to waiting (the KV cache is about to be released)."""
        while self.running:
            self._preempt(self.running.pop())

    def postprocess(self, batch: ScheduledBatch, token_ids: list[int], log_probs: list[float],
                    version: int) -> list[Sequence]:
        """Appends each sampled token; returns the sequences that finished (their blocks are freed). A
        sequence that finished in the previous step (a decode ahead ran it once more) drops its token."""
        finished = []
        for sequence, token_id, log_prob in zip(batch.sequences, token_ids, log_probs):
            if sequence.status is not SequenceStatus.RUNNING:
                continue
            sequence.append_token(token_id, log_prob, version)
            reason = sequence.stop_reason(self.eos_token_ids, self.max_model_len)
            if reason is not None:
                self._finish(sequence, reason)
                finished.append(sequence)
        return finished

    def _finish(self, sequence: Sequence, reason: str) -> None:
        sequence.finish(reason)
        self.block_manager.free(sequence)
        self.running.remove(sequence)

    def abort(self, request_ids: set[str] | None) -> list[Sequence]:
        """Removes the matching (all when None) waiting and running sequences, finished as "abort"."""
        aborted = []
        for queue in (self.running, self.waiting):
            for sequence in list(queue):
                if request_ids is None or sequence.request_id in request_ids:
                    queue.remove(sequence)
                    self.block_manager.free(sequence)
                    sequence.finish("abort")
                    aborted.append(sequence)
        return aborted
