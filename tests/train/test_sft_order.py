"""The SFT epoch order: every example once per epoch; grouped by length, batches of similar lengths."""

import torch

from asyncrl.train.sft import epoch_order


def batches_of(order: torch.Tensor, batch_size: int) -> list[list[int]]:
    return [chunk.tolist() for chunk in order.split(batch_size)]


def test_every_example_once_with_and_without_grouping():
    lengths = [(index * 37) % 101 for index in range(1000)]
    for grouped in (False, True):
        order = epoch_order(lengths, 16, grouped, torch.Generator().manual_seed(0))
        assert sorted(order.tolist()) == list(range(1000))


def test_grouped_batches_hold_similar_lengths_and_the_short_batch_comes_last():
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 200, (16 * 64 * 3 + 5,), generator=generator).tolist()
    order = epoch_order(lengths, 16, True, torch.Generator().manual_seed(2))
    batches = batches_of(order, 16)
    assert [len(batch) for batch in batches[:-1]] == [16] * (len(batches) - 1) and len(batches[-1]) == 5
    spread = sum(max(lengths[i] for i in batch) - min(lengths[i] for i in batch) for batch in batches) / len(batches)
    random_batches = batches_of(epoch_order(lengths, 16, False, torch.Generator().manual_seed(2)), 16)
    random_spread = sum(max(lengths[i] for i in batch) - min(lengths[i] for i in batch)
                        for batch in random_batches) / len(random_batches)
    # A pool of 64 batches sorted by length leaves ~200/64 between a batch's shortest and longest example; random
    # batches of 16 from 1..199 span ~175.
    assert spread < 10 < 150 < random_spread
