"""The response-token forward: the host-side token index the trainer passes in is the one the mask gives."""

from __future__ import annotations

import torch

from asyncrl.models import build_tiny_model, load_model
from asyncrl.train.forward import response_log_probs, response_token_index, with_token_index
from .helpers import make_batch


def test_host_token_index_lists_every_trained_token_and_gives_the_same_log_probs(tmp_path):
    batch = make_batch(seed=3)
    mask = batch.response_mask.clone()
    mask[0, 0] = 0.0  # a token that does not train is left out of the index
    batch = batch.replace(response_mask=mask)
    on_device, token_index = with_token_index(batch, torch.device("cpu"))
    expected = [(row, column) for row in range(mask.shape[0]) for column in range(mask.shape[1])
                if mask[row, column] > 0]
    assert [tuple(pair) for pair in token_index.tolist()] == expected
    assert torch.equal(token_index, response_token_index(on_device.response_mask))

    model = load_model(build_tiny_model(tmp_path / "model", family="qwen2"), dtype=torch.float32)
    with torch.no_grad():
        given = response_log_probs(model, on_device, 0.7, True, token_index)
        derived = response_log_probs(model, on_device, 0.7, True)
    for ours, reference in zip(given, derived):
        assert torch.equal(ours, reference)
    assert given[0][0, 0] == 0.0 and (given[0][mask > 0] < 0).all()
