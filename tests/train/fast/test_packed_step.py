"""The fixed-capacity packed update step behind `actor.cuda_graphs`: its layout, its numbers against the dense
path, the compute copies of the masters, the config checks; on a GPU, graph replays against eager runs."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from asyncrl.config import ConfigError, load_config
from asyncrl.models import build_tiny_model, load_model
from asyncrl.train import PolicyUpdateSpec, TrainerWorker
from asyncrl.train.fast.compute_weights import ComputeWeights
from asyncrl.train.fast.packed_batch import PackCapacity, PackedBuffers, pack_micro_batch
from asyncrl.train.fast.packed_forward import packed_response_log_probs
from asyncrl.train.forward import dense_positions, response_log_probs

from ..helpers import make_batch, run_in_processes, trainer_config
from ..test_trainer_worker import train_shard


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", family="qwen2", seed=3)


def holed_batch():
    """Rows with tokens that do not train: one in the middle of a response, and one row with none at all."""
    batch = make_batch(seed=5)
    mask = batch.response_mask.clone()
    mask[1, 0] = 0.0
    mask[2] = 0.0
    return batch.replace(response_mask=mask)


def test_packing_keeps_rows_apart_and_lists_every_trained_token_once():
    micro = holed_batch().select(range(5))
    lengths = (micro.prompt_lengths + micro.response_lengths).tolist()
    total = sum(lengths)
    capacity = PackCapacity.covering(micro, token_budget=None)
    assert capacity == PackCapacity(tokens=1024, rows=8, response_length=8, trained_tokens=512)
    assert PackCapacity.covering(micro, token_budget=64).tokens == 64  # the budget, whenever the rows fit in it

    packed = pack_micro_batch(micro, capacity, num_tokens=30.0, num_seqs=5.0)
    rows_ids = [micro.input_ids[row, :length] for row, length in enumerate(lengths)]
    assert torch.equal(packed.input_ids[:total], torch.cat(rows_ids)) and (packed.input_ids[total:] == 0).all()
    # Positions restart at 0 for every row, and for the unused tail, which is a sequence of its own.
    assert torch.equal(packed.positions, torch.cat([torch.arange(n) for n in lengths + [1024 - total]]))
    ends = np.cumsum(lengths).tolist()
    assert packed.starts.tolist() == [0, *ends, 1024, 1024, 1024, 1024] and packed.starts.dtype == torch.int32

    trained = torch.nonzero(micro.response_mask > 0)
    count = trained.shape[0]
    rows, columns = trained.unbind(1)
    targets = micro.response_ids()[rows, columns]
    assert torch.equal(packed.target_ids[:count], targets) and (packed.target_ids[count:] == 0).all()
    # The predictor of each trained token is the packed token just before it.
    assert torch.equal(packed.input_ids[packed.predictor_index[:count] + 1], targets)
    assert torch.equal(packed.response_index[:count], rows * 8 + columns)
    assert ((packed.response_index[count:] >= 8 * 8) & (packed.response_index[count:] < 9 * 8)).all()
    width = micro.max_response_length
    assert torch.equal(packed.response_mask[:5, :width], micro.response_mask)
    assert packed.response_mask[5:].sum() == 0 and packed.response_mask[:, width:].sum() == 0
    assert torch.equal(packed.advantages[:5, :width], micro.advantages)
    assert packed.counts.tolist() == [30.0, 5.0]
    with pytest.raises(ValueError, match="does not fit"):
        pack_micro_batch(micro, PackCapacity(tokens=total - 1, rows=8, response_length=8, trained_tokens=512), 1, 1)


def test_packed_buffers_hold_every_field_in_one_aligned_buffer_and_load_in_place():
    micro = holed_batch()
    capacity = PackCapacity.covering(micro, token_budget=None)
    first = pack_micro_batch(micro.select(range(5)), capacity, num_tokens=30.0, num_seqs=5.0)
    second = pack_micro_batch(micro.select([5, 0, 2]), capacity, num_tokens=12.0, num_seqs=3.0)
    buffers = PackedBuffers(first, torch.device("cpu"))
    pointers = {name: tensor.data_ptr() for name, tensor in buffers.batch.tensors().items()}
    for source in (first, second):  # a later micro-batch of the capacity overwrites the same tensors
        buffers.load(source)
        assert {name: tensor.data_ptr() for name, tensor in buffers.batch.tensors().items()} == pointers
        for name, tensor in source.tensors().items():
            loaded = getattr(buffers.batch, name)
            assert loaded.dtype == tensor.dtype and torch.equal(loaded, tensor), name
    storage = buffers.flat.untyped_storage().data_ptr()
    assert all(tensor.untyped_storage().data_ptr() == storage and (tensor.data_ptr() - storage) % 64 == 0
               for tensor in buffers.batch.tensors().values())

def test_packed_log_probs_entropies_and_gradients_equal_the_dense_forward(model_path):
    model = load_model(model_path, dtype=torch.float32)
    micro = holed_batch()
    generator = torch.Generator().manual_seed(0)
    log_prob_weights = torch.randn(micro.response_mask.shape, generator=generator)
    entropy_weights = torch.randn(micro.response_mask.shape, generator=generator)
    parameters = list(model.parameters())

    dense_log_probs, dense_entropy = response_log_probs(model, micro, 0.7, with_entropy=True)
    dense_loss = (dense_log_probs * log_prob_weights).sum() + (dense_entropy * entropy_weights).sum()
    dense_gradients = torch.autograd.grad(dense_loss, parameters)

    packed = pack_micro_batch(micro, PackCapacity.covering(micro, token_budget=None), 1.0, 1.0)
    log_probs, entropy = packed_response_log_probs(model, packed, 0.7)
    rows, width = micro.response_mask.shape
    assert log_probs.shape == entropy.shape == (16, 8)
    assert log_probs[rows:].abs().sum() == 0 and log_probs[:, width:].abs().sum() == 0
    torch.testing.assert_close(log_probs[:rows, :width], dense_log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy[:rows, :width], dense_entropy, atol=1e-5, rtol=0)
    assert (log_probs[2] == 0).all() and log_probs[1, 0] == 0  # tokens that do not train
    loss = (log_probs[:rows, :width] * log_prob_weights).sum() + (entropy[:rows, :width] * entropy_weights).sum()
    for gradient, dense_gradient in zip(torch.autograd.grad(loss, parameters), dense_gradients):
        torch.testing.assert_close(gradient, dense_gradient, atol=1e-5, rtol=1e-5)


# compiled: the CUDA path's accumulation through Inductor's foreach kernels (C++ on the CPU, needs a compiler).
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.skipif(
    shutil.which("g++") is None and not torch.cuda.is_available(), reason="Inductor needs CUDA or a C++ compiler"))])
def test_compute_weights_stand_in_for_the_masters_and_sum_their_gradients_in_fp32(model_path, compiled):
    model = load_model(model_path, dtype=torch.float32)  # tied embedding and LM head
    assert model.lm_head.weight is model.model.embed_tokens.weight
    weights = ComputeWeights(model, torch.bfloat16, compile_accumulation=compiled)
    masters = dict(model.named_parameters())
    assert len(weights.copies) == len(masters) and all(copy.dtype == torch.bfloat16 for copy in weights.copies)
    ids = torch.tensor([[5, 9, 13, 2]])
    with weights.applied():
        assert model.lm_head.weight is model.model.embed_tokens.weight  # one copy in both tied slots
        assert model.lm_head.weight.dtype == torch.bfloat16
        hidden = model(ids, dense_positions(ids))
        loss = model.compute_logits(hidden).logsumexp(-1).sum()
    assert hidden.dtype == torch.bfloat16
    assert dict(model.named_parameters()) == masters  # the masters are back in every slot
    gradients = torch.autograd.grad(loss, weights.trainable, allow_unused=True)
    grad_pointers = [master.grad.data_ptr() for master in weights.trainable_masters]
    # One buffer holds every gradient (zeroed by one kernel), each view starting 64-element aligned.
    assert all(master.grad.untyped_storage().data_ptr() == weights.flat_grads.untyped_storage().data_ptr()
               and master.grad.storage_offset() % 64 == 0 for master in weights.trainable_masters)
    assert len(set(grad_pointers)) == len(grad_pointers)
    # Each attention layer multiplies by one stacked q/k/v copy: the three copies get no gradient of their own,
    # the stacked one's row blocks are theirs.
    expected = dict(zip(map(id, weights.trainable_masters), gradients))
    for (attention, *stacked), gradient_pair in zip(weights.stacked, zip(*[iter(gradients[len(masters):])] * 2)):
        for kind, gradient in zip(("weight", "bias"), gradient_pair):
            offset = 0
            for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
                master = getattr(projection, kind)
                assert expected[id(master)] is None
                expected[id(master)] = gradient[offset:offset + master.shape[0]]
                offset += master.shape[0]
    weights.accumulate(gradients)
    weights.accumulate(gradients)
    for master in weights.trainable_masters:
        assert master.grad.dtype == torch.float32
        assert torch.equal(master.grad, 2 * expected[id(master)].float())
    weights.zero_grads()
    assert [master.grad.data_ptr() for master in weights.trainable_masters] == grad_pointers
    assert all((master.grad == 0).all() for master in weights.trainable_masters)

    pointers = [copy.data_ptr() for copy in weights.copies]
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)
        model.model.layers[0].self_attn.k_proj.weight.add_(0.5)
    weights.refresh()
    attention, stacked_weight, _ = weights.stacked[0]
    rows = attention.q_proj.weight.shape[0]
    assert torch.equal(stacked_weight[rows:rows + attention.k_proj.weight.shape[0]],
                       attention.k_proj.weight.detach().to(torch.bfloat16))  # the stacked copies refresh too
    assert [copy.data_ptr() for copy in weights.copies] == pointers  # in place: a captured graph still sees them
    copy_of_norm = weights.copies[[name for name, _ in model.named_parameters()].index("model.norm.weight")]
    assert torch.equal(copy_of_norm, model.model.norm.weight.detach().to(torch.bfloat16))


def test_compiled_layers_over_compute_weights_give_the_masters_their_gradients(model_path):
    """The graphed step's structure on the CPU: layers compiled (`aot_eager`), the copies and the stacked q/k/v
    copies in their slots, gradients accumulated into the masters. They equal an eager fp32 model's, twice over
    (the stacked copies swap in and out of the compiled layers' inputs between calls)."""
    from asyncrl.models import PackedCausalAttention, compile_decoder_layers

    eager, compiled = load_model(model_path, dtype=torch.float32), load_model(model_path, dtype=torch.float32)
    compile_decoder_layers(compiled, backend="aot_eager")
    weights = ComputeWeights(compiled, None)
    assert len(weights.stacked) == len(compiled.model.layers)
    attention = PackedCausalAttention.from_lengths([5, 3])
    ids = torch.randint(0, eager.config.vocab_size, (8,), generator=torch.Generator().manual_seed(7))
    upstream = torch.randn(8, eager.config.hidden_size, generator=torch.Generator().manual_seed(8))
    (eager(ids, attention.positions(), attention) * upstream).sum().backward()
    for calls in (1, 2):
        weights.refresh()
        with weights.applied():
            loss = (compiled(ids, attention.positions(), attention) * upstream).sum()
        weights.accumulate(torch.autograd.grad(loss, weights.trainable, allow_unused=True))
        for (name, master), reference in zip(compiled.named_parameters(), eager.parameters()):
            torch.testing.assert_close(master.grad, calls * reference.grad, atol=1e-5, rtol=1e-5, msg=name)
    assert all(attention.qkv_weight is None for attention, _, _ in weights.stacked)  # out of the block


@pytest.mark.parametrize("micro_batching", [(), ("actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=12")],
                         ids=["rows", "token-budget"])
def test_one_rank_packed_updates_match_the_fsdp_path_after_three_optimizer_steps(model_path, micro_batching):
    overrides = ("critic.enable=true", "actor.optim.lr=1e-4", *micro_batching)
    (reference, _, reference_metrics, _), = run_in_processes(train_shard, 1, model_path, overrides, 1)
    (packed, _, metrics, _), = run_in_processes(train_shard, 1, model_path, (*overrides, "actor.cuda_graphs=true"), 1)
    assert max(np.abs(packed[name] - reference[name]).max() for name in reference) <= 1e-6
    for name in ("actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/grad_norm"):
        assert metrics[name] == pytest.approx(reference_metrics[name], abs=1e-6), name
    initial = {name: tensor.detach().numpy() for name, tensor in load_model(model_path).named_parameters()}
    assert all(np.abs(packed[name] - initial[name]).max() > 0 for name in initial)  # the steps did move


@pytest.mark.parametrize("overrides, message", [
    (("trainer.n_gpus_per_node=2",), r"actor\.cuda_graphs needs one trainer rank"),
    (("actor.policy_loss.loss_mode=clip_cov",), r"actor\.policy_loss\.loss_mode=clip_cov"),
    (("algorithm.rollout_correction.rollout_is=token",), r"rollout_is / rollout_rs"),
    (("model.gradient_checkpointing=true",), r"model\.gradient_checkpointing=false"),
])
def test_cuda_graphs_refuses_what_a_graph_cannot_replay_before_any_work(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        trainer_config(tmp_path, "actor.cuda_graphs=true", *overrides)
    trainer_config(tmp_path, *overrides)  # each is valid without cuda_graphs


def cuda_updates(rank, world_size, port, model_path, mode):
    """Two updates on CUDA in bf16: `replay` (actor.cuda_graphs, steps replayed from graphs), `packed` (the
    same packed steps run eagerly every time) or `fsdp` (the default path)."""
    config = load_config(None, [
        f"model.path={model_path}", "trainer.device=cuda", "model.dtype=bfloat16", "data.train_batch_size=6",
        "rollout.n=2", "actor.ppo_mini_batch_size=6", "actor.use_dynamic_bsz=true",
        "actor.ppo_max_token_len_per_gpu=24", "actor.optim.lr=1e-4", "actor.shuffle=false",
        "data.max_response_length=8", f"actor.cuda_graphs={str(mode != 'fsdp').lower()}"])
    worker = TrainerWorker(config, rank, world_size, "127.0.0.1", port, total_training_steps=10)
    if mode == "packed":
        worker.actor.fast_update.graphs.capture = False
    batch = make_batch()
    spec = PolicyUpdateSpec.from_config(config, batch.num_rows, step=0)
    metrics = [worker.update_actor(batch, spec) for _ in range(2)]
    num_graphs = 0 if mode == "fsdp" else worker.actor.fast_update.graphs.num_graphs
    return worker.policy_state_numpy(), metrics, num_graphs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_replayed_update_steps_equal_the_same_steps_run_eagerly_on_cuda(model_path):
    (replayed, replayed_metrics, num_graphs), = run_in_processes(cuda_updates, 1, model_path, "replay")
    (eager, eager_metrics, _), = run_in_processes(cuda_updates, 1, model_path, "packed")
    (fsdp, fsdp_metrics, _), = run_in_processes(cuda_updates, 1, model_path, "fsdp")
    assert num_graphs >= 1
    # Atomic adds (embedding and LM-head gathers' backward) sum in any order: equal up to float rounding.
    assert max(np.abs(replayed[name] - eager[name]).max() for name in eager) <= 1e-6
    for replayed_update, eager_update, fsdp_update in zip(replayed_metrics, eager_metrics, fsdp_metrics):
        for name in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/grad_norm"):
            assert replayed_update[name] == pytest.approx(eager_update[name], rel=1e-4, abs=1e-6), name
            assert replayed_update[name] == pytest.approx(fsdp_update[name], rel=2e-2, abs=1e-4), name


# Operations that make the host wait for a CUDA device (a value or a data-dependent size read back), which a
# CUDA graph cannot capture. On the CPU they run without complaint, so the step is checked for them by name.
SYNCHRONISING_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
                     "repeat_interleave", "item", "equal", "is_nonzero", "allclose"}


class OperationLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def logged_packed_step(rank, world_size, port, model_path, loss_mode):
    """The operations one packed step dispatches (forward, loss with entropy bonus and KL loss, backward)."""
    config = trainer_config(model_path, "actor.cuda_graphs=true", "actor.use_kl_loss=true", "actor.entropy_coeff=0.01",
                            f"actor.policy_loss.loss_mode={loss_mode}")
    worker = TrainerWorker(config, rank, world_size, "127.0.0.1", port, total_training_steps=10)
    micro = holed_batch()
    micro = micro.replace(ref_log_probs=micro.old_log_probs - 0.1)
    packed = pack_micro_batch(micro, PackCapacity.covering(micro, token_budget=None), 40.0, 11.0)
    update = worker.actor.fast_update
    log = OperationLog()
    with log:
        metrics = update.packed_step(packed, PolicyUpdateSpec.from_config(config, micro.num_rows, step=0))
    has_gradients = all(bool(master.grad.abs().sum() > 0) for master in update.weights.trainable_masters)
    return log.names, sorted(metrics.additive), has_gradients


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo", "cispo"])
def test_the_packed_step_runs_no_operation_that_would_synchronise_a_cuda_host(model_path, loss_mode):
    (names, additive, has_gradients), = run_in_processes(logged_packed_step, 1, model_path, loss_mode)
    assert {"mm", "index_select"} <= names  # the log saw the step
    assert not SYNCHRONISING_OPS & names, sorted(SYNCHRONISING_OPS & names)
    assert additive == ["entropy", "kl_loss", "pg_loss"] and has_gradients


def packed_resume_run(rank, world_size, port, model_path, folder, phase):
    """Updates with actor.cuda_graphs (a plain module, no FSDP): 4 straight, or 2, a checkpoint, and 2 more in
    a fresh process; the policy weights and the compute copies the next step would use."""
    config = trainer_config(model_path, "actor.cuda_graphs=true")
    worker = TrainerWorker(config, rank, world_size, "127.0.0.1", port, total_training_steps=10)
    batch = make_batch(seed=2)
    spec = PolicyUpdateSpec.from_config(config, batch.num_rows, step=0)
    if phase == "resume":
        worker.load_checkpoint(folder)
    for _ in range(4 if phase == "straight" else 2):
        worker.update_actor(batch, spec)
    if phase == "first_half":
        worker.save_checkpoint(folder)
    log_probs, _ = worker.compute_log_prob(batch)  # through the compute copies, refreshed from the masters
    return worker.policy_state_numpy(), log_probs.numpy()


def test_packed_updates_resume_exactly_from_a_checkpoint(model_path, tmp_path):
    folder = tmp_path / "ckpt"
    (straight, straight_log_probs), = run_in_processes(packed_resume_run, 1, model_path, folder, "straight")
    run_in_processes(packed_resume_run, 1, model_path, folder, "first_half")
    (resumed, resumed_log_probs), = run_in_processes(packed_resume_run, 1, model_path, folder, "resume")
    for name in straight:
        assert np.array_equal(resumed[name], straight[name]), name
    assert np.array_equal(resumed_log_probs, straight_log_probs)
