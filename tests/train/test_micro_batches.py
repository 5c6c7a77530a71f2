"""Micro-batch plans (`asyncrl/train/micro_batches.py`): every row in exactly one micro-batch, within the token
budget, each selected from the batch only when it is reached."""

from __future__ import annotations

import torch

from asyncrl.train.batch import TrainBatch
from asyncrl.train.micro_batches import micro_batches

from .helpers import make_batch


def test_every_row_lands_in_one_micro_batch_within_the_budget_selected_when_reached(monkeypatch):
    batch = make_batch(seed=1)
    lengths = batch.prompt_lengths + batch.response_lengths
    selected = []
    original = TrainBatch.select
    monkeypatch.setattr(TrainBatch, "select", lambda self, rows: selected.append(rows) or original(self, rows))
    plan = micro_batches(batch, micro_batch_size=2, max_tokens=int(lengths.max()) * 2)
    assert len(plan) >= 2 and selected == []  # planned, nothing copied out yet
    seen = []
    for index, (rows, micro) in enumerate(plan):
        assert len(selected) == index + 1  # the micro-batch in hand is the only one selected so far
        assert int(lengths[rows].max()) * len(rows) <= int(lengths.max()) * 2
        assert torch.equal(micro.input_ids, original(batch, rows).input_ids)
        seen += rows.tolist()
    assert sorted(seen) == list(range(batch.num_rows))
