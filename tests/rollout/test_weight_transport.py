"""The weight-transfer plan and the bucketed broadcast, on a real gloo group of two ranks (two threads)."""

from __future__ import annotations

import threading
from typing import Any, Callable

import pytest
import torch

from asyncrl.bench.trainer_ranks import free_port
from asyncrl.rollout.weight_transport import ALIGNMENT, TransferPlan, WeightReceiver, WeightSender, create_group

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


def two_rank_syncs(plan: TransferPlan, num_syncs: int, send: Callable[[Any, int], None],
                   receive: Callable[[Any, int], None], sender_type: type = WeightSender,
                   receiver_type: type = WeightReceiver) -> None:
    """`num_syncs` transfers over one gloo group: `send(sender, sync)` on this thread (group rank 0),
    `receive(receiver, sync)` on a second one (rank 1); an error on either side fails the caller."""
    port = free_port()
    errors: list[BaseException] = []

    def run_receiver() -> None:
        try:
            group = create_group("127.0.0.1", port, 1, 2, torch.device("cpu"), 30)
            receiver = receiver_type(group, plan, torch.device("cpu"))
            for sync in range(num_syncs):
                receive(receiver, sync)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    thread = threading.Thread(target=run_receiver)
    thread.start()
    group = create_group("127.0.0.1", port, 0, 2, torch.device("cpu"), 30)
    sender = sender_type(group, plan, torch.device("cpu"))
    for sync in range(num_syncs):
        send(sender, sync)
    thread.join(60)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("persistent", [False, True], ids=["streamed", "persistent"])
def test_broadcast_through_small_buckets_delivers_every_tensor_bitwise_sync_after_sync(persistent):
    """Three syncs over one group, the source updated in place between them (as an optimizer does): the
    streamed sender (tensors yielded one by one, as FSDP gathers them) and the persistent one (views made
    once, one foreach copy per bucket) both deliver each state straight into the receiver's tensors."""
    plan = TransferPlan.build(SHAPES, torch.bfloat16, bucket_bytes=512)
    generator = torch.Generator().manual_seed(0)
    source = {name: torch.randn(shape, generator=generator) for name, shape in SHAPES}  # fp32: cast on the way
    targets = {name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in SHAPES}
    received: list[dict[str, torch.Tensor]] = []
    expected = []

    def send(sender: WeightSender, sync: int) -> None:
        expected.append({name: tensor.to(torch.bfloat16) for name, tensor in source.items()})
        assert sender.send(iter(source.items()), persistent=persistent) == plan.total_bytes
        for tensor in source.values():
            tensor.add_(1.0 + sync)  # in place: the persistent path's views stay valid

    def receive(receiver: WeightReceiver, sync: int) -> None:
        assert receiver.receive_into(targets) == len(SHAPES)
        received.append({name: tensor.clone() for name, tensor in targets.items()})

    two_rank_syncs(plan, 3, send, receive)
    assert len(received) == 3
    for got, want in zip(received, expected):
        assert list(got) == [name for name, _ in SHAPES]
        for name in want:
            assert got[name].dtype == torch.bfloat16 and torch.equal(got[name], want[name])
    assert not torch.equal(received[0]["big"], received[2]["big"])


# Per sync, the tensors that move to new storage before it, on each side: none (the views are made), one
# (the rest stay put), a different one on each side, every one, then none again (in-place updates only).
MOVED_BY_SENDER = [(), ("big",), ("bias",), tuple(name for name, _ in SHAPES), ()]
MOVED_BY_RECEIVER = [(), ("big",), ("embed", "last"), tuple(name for name, _ in SHAPES), ()]


def test_tensors_moved_to_new_storage_between_syncs_are_read_and_written_where_they_now_live():
    """The persistent sender and the receiver reuse the views of their last sync while every tensor's storage
    stays put. A parameter whose storage is replaced between syncs (`param.data = ...`, as an optimizer,
    FSDP or a checkpoint load may do) must be read from, and received into, its new storage: views of the old
    one would send stale values, or write where the engine no longer reads."""
    plan = TransferPlan.build(SHAPES, torch.bfloat16, bucket_bytes=512)
    generator = torch.Generator().manual_seed(1)
    source = {name: torch.nn.Parameter(torch.randn(shape, generator=generator)) for name, shape in SHAPES}
    targets = {name: torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16), requires_grad=False)
               for name, shape in SHAPES}
    expected, received = [], []

    def send(sender: WeightSender, sync: int) -> None:
        with torch.no_grad():
            for name, parameter in source.items():
                if name in MOVED_BY_SENDER[sync]:
                    parameter.data = parameter.data + (sync + 1)  # new storage; the old one keeps the old values
                else:
                    parameter.add_(0.5)
        expected.append({name: parameter.detach().to(torch.bfloat16) for name, parameter in source.items()})
        assert sender.send(list(source.items()), persistent=True) == plan.total_bytes

    def receive(receiver: WeightReceiver, sync: int) -> None:
        for name in MOVED_BY_RECEIVER[sync]:
            targets[name].data = torch.zeros_like(targets[name].data)  # new storage, not written yet
        receiver.receive_into(targets)
        received.append({name: parameter.detach().clone() for name, parameter in targets.items()})

    two_rank_syncs(plan, len(MOVED_BY_SENDER), send, receive)
    for sync, (got, want) in enumerate(zip(received, expected)):
        for name in want:
            assert torch.equal(got[name], want[name]), (sync, name)


def test_receiving_into_an_engine_without_a_tensor_names_it():
    plan = TransferPlan.build(SHAPES, torch.bfloat16, bucket_bytes=512)
    group = create_group("127.0.0.1", free_port(), 0, 1, torch.device("cpu"), 30)  # checked before any transfer
    receiver = WeightReceiver(group, plan, torch.device("cpu"))
    with pytest.raises(ValueError, match="no tensor bias"):
        receiver.receive_into({name: torch.zeros(shape, dtype=torch.bfloat16) for name, shape in SHAPES
                               if name != "bias"})


def test_received_by_name_each_tensor_arrives_whole_in_plan_order_once_its_last_bucket_is_in():
    """A loader that takes (name, tensor) pairs (vLLM's) gets every tensor once, bitwise, in plan order, even
    the one split over two buckets; a tensor it keeps is not overwritten by later buckets."""
    shapes = SHAPES
    plan = TransferPlan.build(shapes, torch.bfloat16, bucket_bytes=512)
    generator = torch.Generator().manual_seed(1)
    source = {name: torch.randn(shape, generator=generator) for name, shape in shapes}
    received: list[tuple[str, torch.Tensor]] = []

    def send(sender: WeightSender, sync: int) -> None:
        sender.send(iter(source.items()), persistent=False)

    def receive(receiver: WeightReceiver, sync: int) -> None:
        received.extend(receiver.receive_named())

    two_rank_syncs(plan, 1, send, receive)
    assert [name for name, _ in received] == [name for name, _ in SHAPES]
    for name, tensor in received:
        assert tensor.shape == source[name].shape and torch.equal(tensor, source[name].to(torch.bfloat16))
