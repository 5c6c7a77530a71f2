"""The weight-transfer plan and the bucketed broadcast, on a real gloo group of two ranks (two threads)."""

from __future__ import annotations

import threading

import pytest
import torch

from asyncrl.bench.trainer_ranks import free_port
from asyncrl.distributed.weight_transport import ALIGNMENT, TransferPlan, WeightReceiver, WeightSender, create_group

SHAPES = [("embed", (10, 8)), ("big", (40, 9)), ("bias", (3,)), ("last", (5, 5))]  # bf16: 160, 720, 6, 50 bytes


def test_plan_covers_every_byte_once_aligned_and_splits_tensors_larger_than_a_bucket():
    plan = TransferPlan.build(SHAPES, torch.bfloat16, bucket_bytes=512)
    for name, shape in SHAPES:
        pieces = [piece for piece in plan.pieces if piece.name == name]
        assert pieces[0].start == 0 and pieces[-1].stop == 2 * torch.Size(shape).numel()
        assert all(a.stop == b.start for a, b in zip(pieces, pieces[1:]))  # contiguous, no byte twice
    assert all(piece.offset % ALIGNMENT == 0 for piece in plan.pieces)
    # embed: 160 bytes at 0 of bucket 0; big: its first 256 bytes at 256 (bucket 0 is then full), its other
    # 464 at 0 of bucket 1 (aligned end 512: full); bias opens bucket 2 at 0, last follows at 256.
    big = [piece for piece in plan.pieces if piece.name == "big"]
    assert [(p.bucket, p.offset, p.start, p.stop) for p in big] == [(0, 256, 0, 256), (1, 0, 256, 720)]
    assert plan.num_buckets == 3
    # Only the bytes a bucket uses travel: a full bucket, big's tail, then bias (6 bytes) + last (50 at 256).
    assert plan.bucket_sizes == (512, 464, 306)
    assert plan.total_bytes == 160 + 720 + 6 + 50


def test_a_small_model_sends_only_its_bytes_not_whole_buckets():
    plan = TransferPlan.build(SHAPES, torch.float32, bucket_bytes=256 << 20)
    assert plan.num_buckets == 1
    last = max(plan.pieces, key=lambda piece: piece.offset)
    assert plan.bucket_sizes == (last.offset + last.stop,)
    assert plan.bucket_sizes[0] < 4096


@pytest.mark.parametrize("persistent", [False, True], ids=["streamed", "persistent"])
def test_broadcast_through_small_buckets_delivers_every_tensor_bitwise_sync_after_sync(persistent):
    """Three syncs over one group, the source updated in place between them (as an optimizer does): the
    streamed sender (tensors yielded one by one, as FSDP gathers them) and the persistent one (views made
    once, one foreach copy per bucket) both deliver each state straight into the receiver's tensors."""
    plan = TransferPlan.build(SHAPES, torch.bfloat16, bucket_bytes=512)
    generator = torch.Generator().manual_seed(0)
    source = {name: torch.randn(shape, generator=generator) for name, shape in SHAPES}  # fp32: cast on the way
    targets = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in SHAPES}
    port = free_port()
    received: list[dict[str, torch.Tensor]] = []
    errors: list[BaseException] = []

    def receive() -> None:
        try:
            group = create_group("127.0.0.1", port, 1, 2, torch.device("cpu"), 30)
            receiver = WeightReceiver(group, plan, torch.device("cpu"))
            for _ in range(3):
                assert receiver.receive_into(targets) == len(SHAPES)
                received.append({name: tensor.clone() for name, tensor in targets.items()})
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    thread = threading.Thread(target=receive)
    thread.start()
    group = create_group("127.0.0.1", port, 0, 2, torch.device("cpu"), 30)
    sender = WeightSender(group, plan, torch.device("cpu"))
    expected = []
    for round_ in range(3):
        expected.append({name: tensor.to(torch.bfloat16) for name, tensor in source.items()})
        assert sender.send(iter(source.items()), persistent=persistent) == plan.total_bytes
        for tensor in source.values():
            tensor.add_(1.0 + round_)  # in place: the persistent path's views stay valid
    thread.join(60)
    assert not errors and not thread.is_alive()
    assert len(received) == 3
    for got, want in zip(received, expected):
        assert list(got) == [name for name, _ in SHAPES]
        for name in want:
            assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], want[name])
    assert not torch.equal(received[0]["big"], received[2]["big"])


def test_receiving_into_an_engine_without_a_tensor_names_it():
    plan = TransferPlan.build(SHAPES, torch.bfloat16, bucket_bytes=512)
    group = create_group("127.0.0.1", free_port(), 0, 1, torch.device("cpu"), 30)  # checked before any transfer
    receiver = WeightReceiver(group, plan, torch.device("cpu"))
    with pytest.raises(ValueError, match="no tensor bias"):
        receiver.receive_into({name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in SHAPES
                               if name != "bias"})
