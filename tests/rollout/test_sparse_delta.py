"""Sparse weight deltas: the pure encode/apply functions against hand-computed cases, then the delta stream on a
real gloo group of two ranks (two threads), through buckets small enough that tensors span them, and a
planted dropped index caught by the weight sync's equality check."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.models import build_tiny_model, load_model
from asyncrl.rollout.delta_transport import DeltaReceiver, DeltaSender, stream_bucket_bytes
from asyncrl.rollout.sparse_delta import (Encoding, apply_delta, blob_layout, cheapest_encoding, delta_blob,
                                          encode_delta, pack_bits, unpack_bits)
from asyncrl.rollout.weight_transport import TransferPlan
from tests.rollout.test_weight_sync import assert_states_equal, is_rejected
from tests.rollout.test_weight_transport import two_rank_syncs


def bf16(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bfloat16)


def test_the_cheapest_encoding_by_hand():
    # 100 bf16 elements: dense 200 bytes; indices 4 + 2 per changed (values after an 8-byte boundary);
    # bitmask 13 bytes (16 aligned) + 2 per changed.
    assert blob_layout(Encoding.INDICES, 1, 100, 2).total_bytes == 8 + 2
    assert blob_layout(Encoding.BITMASK, 20, 100, 2).total_bytes == 16 + 40
    assert blob_layout(Encoding.DENSE, 100, 100, 2).total_bytes == 200
    assert blob_layout(Encoding.INDICES, 0, 100, 2).total_bytes == 0   # unchanged: nothing travels
    assert cheapest_encoding(0, 100, 2) == Encoding.INDICES
    assert cheapest_encoding(1, 100, 2) == Encoding.INDICES      # 10 against 18 and 200
    assert cheapest_encoding(4, 100, 2) == Encoding.INDICES      # 16 + 8 = 24 against 16 + 8: indices on a tie
    assert cheapest_encoding(5, 100, 2) == Encoding.BITMASK      # 24 + 10 = 34 against 16 + 10 = 26
    assert cheapest_encoding(91, 100, 2) == Encoding.BITMASK     # 16 + 182 = 198 against 200
    assert cheapest_encoding(92, 100, 2) == Encoding.DENSE       # 16 + 184 = 200: dense on a tie
    assert cheapest_encoding(95, 100, 2) == Encoding.DENSE       # 206 against 200
    # The crossover of indices and bitmask does not depend on the values' width: 4 bytes an index against a bit
    # an element, so a bitmask past numel / 32 changed.
    assert cheapest_encoding(31, 1024, 4) == Encoding.INDICES and cheapest_encoding(34, 1024, 4) == Encoding.BITMASK


def test_bits_pack_little_end_first():
    mask = torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1], dtype=torch.bool)
    packed = pack_bits(mask)
    assert packed.tolist() == [0b00001101, 0b00000001]
    assert torch.equal(unpack_bits(packed, 9), mask)


def test_encode_finds_changed_bits_not_changed_values_and_apply_restores_them():
    last = bf16([1.0, 2.0, 0.0, float("nan"), 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0])
    new = last.clone()
    new[1] = 2.5
    new[2] = -0.0          # equal as a value, another bit pattern: it must travel
    new[9] = 10.0 + 1e-4   # below bf16's resolution at 10: rounds back to 10.0, not a change
    delta = encode_delta(new, last)
    assert delta.kind == Encoding.INDICES and delta.count == 2
    assert delta.positions.tolist() == [1, 2]
    target = last.clone()
    apply_delta(target, delta.kind, delta.count, delta_blob(delta))
    assert torch.equal(target.view(torch.int16), new.view(torch.int16))   # NaN and -0.0 bit for bit


def test_each_encoding_round_trips_bitwise():
    generator = torch.Generator().manual_seed(0)
    last = torch.randn(1000, generator=generator).to(torch.bfloat16)
    for num_changed, kind in ((3, Encoding.INDICES), (300, Encoding.BITMASK), (990, Encoding.DENSE)):
        new = last.clone()
        positions = torch.randperm(1000, generator=generator)[:num_changed]
        new[positions] = (new[positions].float() * 2 + 1).to(torch.bfloat16)
        delta = encode_delta(new, last)
        assert delta.kind == kind and delta.count == int((new.view(torch.int16) != last.view(torch.int16)).sum())
        blob = delta_blob(delta)
        assert blob.numel() == blob_layout(kind, delta.count, 1000, 2).total_bytes
        target = last.clone()
        apply_delta(target, delta.kind, delta.count, blob)
        assert torch.equal(target.view(torch.int16), new.view(torch.int16)), kind
    assert encode_delta(last, None).kind == Encoding.DENSE   # nothing known of the receiver: every element


def test_a_delta_of_the_wrong_size_is_refused_by_name():
    last = torch.zeros(64, dtype=torch.bfloat16)
    new = last.clone()
    new[7] = 1.0
    delta = encode_delta(new, last)
    with pytest.raises(ValueError, match="indices delta of 1 elements is 10 bytes, 9 arrived"):
        apply_delta(last, delta.kind, delta.count, delta_blob(delta)[:9])


SHAPES = [("embed", (10, 8)), ("big", (40, 9)), ("bias", (3,)), ("last", (5, 5))]


def test_the_stream_through_tiny_buckets_equals_a_dense_sync_sync_after_sync():
    """Five syncs over one group with 64-byte buckets (every dense tensor and some deltas span several): the
    first dense (nothing known), then small, large, no and full changes; the receiver ends each one bitwise equal
    to the sender's weights cast to bf16, as a dense sync leaves it, and fewer bytes travel when little changed."""
    plan = TransferPlan.build(SHAPES, torch.bfloat16, bucket_bytes=64, sparse=True)
    assert stream_bucket_bytes(plan) == 64
    generator = torch.Generator().manual_seed(2)
    source = {name: torch.randn(shape, generator=generator) for name, shape in SHAPES}  # fp32 masters
    targets = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in SHAPES}
    changes = [None, 0.02, 0.5, 0.0, 1.0]   # fraction of each tensor's elements moved before each sync
    expected, received, stats = [], [], []

    def send(sender: DeltaSender, sync: int) -> None:
        for tensor in source.values():
            moved = torch.rand(tensor.shape, generator=generator) < (changes[sync] or 0.0)
            tensor.add_(moved * (tensor.abs() * 0.1 + 0.01))   # well above bf16's resolution
        expected.append({name: tensor.to(torch.bfloat16) for name, tensor in source.items()})
        stats.append(sender.sync(iter(source.items()), persistent=False))

    def receive(receiver: DeltaReceiver, sync: int) -> None:
        assert receiver.receive_into(targets) == len(SHAPES)
        received.append({name: tensor.clone() for name, tensor in targets.items()})

    two_rank_syncs(plan, len(changes), send, receive, sender_type=DeltaSender, receiver_type=DeltaReceiver)
    for sync, (got, want) in enumerate(zip(received, expected)):
        for name in want:
            assert torch.equal(got[name].view(torch.int16), want[name].view(torch.int16)), (sync, name)
    dense = plan.total_bytes
    assert [round(s.changed_fraction, 2) for s in stats][0] == 1.0 and stats[3].changed_fraction == 0.0
    assert stats[1].changed_fraction < 0.1 and stats[1].bytes < dense / 2 < stats[4].bytes
    assert all(s.dense_bytes == dense for s in stats)


def test_a_planted_dropped_index_fails_the_weight_equality_check(tmp_path, monkeypatch):
    """The receiver of a real model's weights loses one changed element of one delta: the check every weight
    sync test uses (`assert_states_equal`) must reject the engine, while the same sync without the plant passes."""
    folder = build_tiny_model(tmp_path / "model", family="qwen2", seed=1, tie_word_embeddings=False)
    config = load_config(None, [f"model.path={folder}", "trainer.device=cpu", "trainer.mode=one_step_off",
                                "rollout.n_gpus_per_node=1"])
    masters = dict(load_model(folder).named_parameters())
    plan = TransferPlan.build([(name, tuple(p.shape)) for name, p in masters.items()], torch.bfloat16,
                              bucket_bytes=4096, sparse=True)
    engine = {name: p.detach().to(torch.bfloat16) for name, p in masters.items()}
    dropped = {}

    import asyncrl.rollout.delta_transport as transport

    def dropping_apply(target, kind, count, blob):
        if kind == Encoding.INDICES and count > 1 and not dropped:
            # the last index and its value go missing (values sit after the 8-byte aligned index list)
            index_bytes, value_offset = 4 * count, -(-4 * count // 8) * 8
            short = blob_layout(kind, count - 1, target.numel(), 2)
            planted = torch.zeros(short.total_bytes, dtype=torch.uint8)
            planted[:short.positions_bytes] = blob[:index_bytes - 4]
            planted[short.values_offset:] = blob[value_offset:value_offset + 2 * (count - 1)]
            dropped["count"] = count
            return apply_delta(target, kind, count - 1, planted)
        return apply_delta(target, kind, count, blob)

    states = []

    def send(sender: DeltaSender, sync: int) -> None:
        if sync:
            with torch.no_grad():
                for parameter in masters.values():   # a few elements per tensor move
                    parameter.view(-1)[:3] += 0.25
        states.append({name: p.detach().to(torch.bfloat16).float().numpy() for name, p in masters.items()})
        sender.sync(iter(masters.items()), persistent=False)

    def receive(receiver: DeltaReceiver, sync: int) -> None:
        if sync == 2:
            monkeypatch.setattr(transport, "apply_delta", dropping_apply)
        receiver.receive_into(engine)
        snapshot = {name: t.float().numpy() for name, t in engine.items()}
        states.append({**snapshot, "__version__": sync})

    two_rank_syncs(plan, 3, send, receive, sender_type=DeltaSender, receiver_type=DeltaReceiver)
    # send and receive alternate per sync only in order of completion; pair them by kind
    trainer_states = [state for state in states if "__version__" not in state]
    engine_states = [state for state in states if "__version__" in state]
    assert dropped["count"] == 3
    assert_states_equal(config, trainer_states[1], [engine_states[1]], 1)
    assert is_rejected(config, trainer_states[2], [engine_states[2]], 2)
