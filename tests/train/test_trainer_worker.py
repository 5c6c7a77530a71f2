"""Trainer workers on real gloo process groups with FSDP2: equivalence to one process, learning,
exact resume, gradient accumulation, and log-probs that match the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from asyncrl.models import build_tiny_model, load_model
from asyncrl.train import CriticUpdateSpec, PolicyUpdateSpec, TrainBatch, TrainerWorker, shard_batch
from asyncrl.train.forward import dense_positions, response_token_index
from asyncrl.train.metric_sums import MetricSums
from asyncrl.train.parallel import clip_gradients, defer_gradient_reduction, full_tensor, reshard_all

from .helpers import make_batch, run_in_processes, trainer_config


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", family="qwen2", seed=3)


def train_shard(rank, world_size, port, model_path, overrides, num_updates):
    """Build a worker, train on this rank's shard, return full policy and critic weights."""
    config = trainer_config(model_path, *overrides)
    worker = TrainerWorker(config, rank, world_size, "127.0.0.1", port, total_training_steps=10)
    batch = make_batch()
    spec = PolicyUpdateSpec.from_config(config, batch.num_rows, step=0)
    critic_spec = CriticUpdateSpec.from_config(config, batch.num_rows, step=0)
    shards, _ = shard_batch(batch, world_size, spec.num_mini_batches)
    for _ in range(num_updates):
        actor_metrics = worker.update_actor(shards[rank], spec)
        critic_metrics = worker.update_critic(shards[rank], critic_spec)
    critic_weights = {name: full_tensor(tensor).detach().numpy() for name, tensor in worker.critic.model.state_dict().items()}
    return worker.policy_state_numpy(), critic_weights, actor_metrics, critic_metrics


def test_two_rank_fsdp_matches_one_process_after_three_optimizer_steps(model_path):
    # Adam turns rounding-level gradient differences on near-zero gradients into lr-sized steps, so the
    # comparison uses a small lr; the weights still move (asserted below).
    overrides = ("critic.enable=true", "actor.optim.lr=1e-4", "critic.optim.lr=1e-4")
    (single_policy, single_critic, single_metrics, _), = run_in_processes(train_shard, 1, model_path, overrides, 1)
    ranks = run_in_processes(train_shard, 2, model_path, overrides, 1)
    assert single_metrics["actor/grad_norm"] > 0
    for policy, critic, metrics, _ in ranks:
        assert max(np.abs(policy[name] - single_policy[name]).max() for name in policy) <= 1e-6
        assert max(np.abs(critic[name] - single_critic[name]).max() for name in critic) <= 1e-6
        assert metrics["actor/pg_loss"] == pytest.approx(single_metrics["actor/pg_loss"], abs=1e-6)
        assert metrics["actor/pg_clipfrac"] == pytest.approx(single_metrics["actor/pg_clipfrac"], abs=1e-6)
    initial = {name: tensor.detach().numpy() for name, tensor in load_model(model_path).named_parameters()}
    assert all(np.abs(single_policy[name] - initial[name]).max() > 0 for name in initial)  # 3 steps did move


def test_gradient_accumulation_over_micro_batches_equals_whole_mini_batch(model_path):
    results = []
    for overrides in (("actor.ppo_micro_batch_size_per_gpu=1",), ("actor.ppo_micro_batch_size_per_gpu=4",),
                      ("actor.use_dynamic_bsz=true", "actor.ppo_max_token_len_per_gpu=12")):
        overrides = ("critic.enable=true", "actor.optim.lr=1e-4", *overrides)
        (policy, _, metrics, _), = run_in_processes(train_shard, 1, model_path, overrides, 1)
        results.append((policy, metrics))
    reference_policy, reference_metrics = results[0]
    for policy, metrics in results[1:]:
        assert max(np.abs(policy[name] - reference_policy[name]).max() for name in policy) <= 1e-6
        assert metrics["actor/pg_loss"] == pytest.approx(reference_metrics["actor/pg_loss"], abs=1e-6)


def single_worker(model_path, port, *overrides):
    return TrainerWorker(trainer_config(model_path, *overrides), 0, 1, "127.0.0.1", port, total_training_steps=10)


def learn_and_compare(rank, world_size, port, model_path):
    worker = single_worker(model_path, port)
    batch = make_batch(seed=1)
    old_log_probs, _ = worker.compute_log_prob(batch)
    sign = torch.where(torch.arange(batch.num_rows) % 2 == 0, 1.0, -1.0)
    batch = batch.replace(old_log_probs=old_log_probs, advantages=sign[:, None] * batch.response_mask)
    before = {name: tensor.copy() for name, tensor in worker.policy_state_numpy().items()}
    spec = PolicyUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    for _ in range(3):
        worker.update_actor(batch, spec)
    after_log_probs, _ = worker.compute_log_prob(batch)
    after = worker.policy_state_numpy()
    changed = {name: bool(np.abs(after[name] - before[name]).max() > 0) for name in before}
    delta = ((after_log_probs - old_log_probs) * batch.response_mask).sum(dim=1)
    return delta.numpy(), sign.numpy(), changed


def test_policy_gradient_moves_log_probs_by_advantage_sign_and_changes_every_parameter(model_path):
    (delta, sign, changed), = run_in_processes(learn_and_compare, 1, model_path)
    assert all(changed.values()), [name for name, is_changed in changed.items() if not is_changed]
    assert (delta[sign > 0] > 0).all(), delta
    assert (delta[sign < 0] < 0).all(), delta


def resume_run(rank, world_size, port, model_path, folder, phase):
    worker = single_worker(model_path, port, "critic.enable=true")
    batch = make_batch(seed=2)
    spec = PolicyUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    critic_spec = CriticUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    if phase == "resume":
        worker.load_checkpoint(folder)
    for _ in range(4 if phase == "straight" else 2):
        worker.update_actor(batch, spec)
        worker.update_critic(batch, critic_spec)
    if phase == "first_half":
        worker.save_checkpoint(folder)
    return worker.policy_state_numpy(), worker.actor.optimizer.param_groups[0]["lr"]


def test_resume_in_a_fresh_process_continues_exactly(model_path, tmp_path):
    folder = tmp_path / "ckpt"
    (straight, straight_lr), = run_in_processes(resume_run, 1, model_path, folder, "straight")
    run_in_processes(resume_run, 1, model_path, folder, "first_half")
    (resumed, resumed_lr), = run_in_processes(resume_run, 1, model_path, folder, "resume")
    assert resumed_lr == straight_lr
    for name in straight:
        assert np.array_equal(resumed[name], straight[name]), name


def log_probs_and_export(rank, world_size, port, model_path, export_folder):
    worker = single_worker(model_path, port, "rollout.temperature=0.7")
    batch = make_batch(seed=4)
    log_probs, entropy = worker.compute_log_prob(batch)
    worker.export_policy(export_folder)
    return batch.to_numpy(), log_probs.numpy(), entropy.numpy()  # numpy: tensors would go through shared memory


def test_log_probs_match_a_plain_forward_and_export_loads_in_transformers(model_path, tmp_path):
    transformers = pytest.importorskip("transformers")
    (arrays, log_probs, entropy), = run_in_processes(log_probs_and_export, 1, model_path, tmp_path / "export")
    batch, log_probs, entropy = TrainBatch.from_numpy(arrays), torch.from_numpy(log_probs), torch.from_numpy(entropy)
    model = load_model(model_path)
    with torch.no_grad():
        logits = model.compute_logits(model(batch.input_ids, dense_positions(batch.input_ids))) / 0.7
    reference = torch.log_softmax(logits, -1)
    for row in range(batch.num_rows):
        start, length = int(batch.prompt_lengths[row]), int(batch.response_lengths[row])
        tokens = batch.input_ids[row, start:start + length]
        expected = reference[row, start - 1:start + length - 1].gather(1, tokens[:, None]).squeeze(1)
        assert torch.allclose(log_probs[row, :length], expected, atol=1e-5)
        assert (log_probs[row, length:] == 0).all()
    assert (entropy[batch.response_mask > 0] > 0).all()
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32)
    original = load_model(model_path)
    for name, tensor in original.named_parameters():
        assert torch.equal(exported.state_dict()[name], tensor.detach()), name


def nonfinite_steps(rank, world_size, port, model_path):
    """One optimizer step per update: NaN advantages, then finite ones, then NaN twice in a row."""
    worker = single_worker(model_path, port, "actor.ppo_mini_batch_size=6", "trainer.max_consecutive_nonfinite=2")
    batch = make_batch(seed=5)
    spec = PolicyUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    poisoned = batch.replace(advantages=batch.advantages.clone().index_fill_(0, torch.tensor([3]), float("nan")))
    before = worker.policy_state_numpy()
    skipped = worker.update_actor(poisoned, spec)
    after_skip = worker.policy_state_numpy()
    worker.update_actor(batch, spec)
    after_finite = worker.policy_state_numpy()
    worker.update_actor(poisoned, spec)
    try:
        worker.update_actor(poisoned, spec)
        error = ""
    except Exception as raised:  # the second NaN step in a row stops the run
        error = f"{type(raised).__name__}: {raised}"
    unchanged = all(np.array_equal(after_skip[name], before[name]) for name in before)
    moved = any(not np.array_equal(after_finite[name], after_skip[name]) for name in before)
    return skipped["actor/num_skipped_steps"], unchanged, moved, error


def test_a_nan_loss_skips_the_step_counts_it_and_repeated_ones_stop_the_run(model_path):
    (num_skipped, unchanged, moved, error), = run_in_processes(nonfinite_steps, 1, model_path)
    assert num_skipped == 1 and unchanged and moved
    assert error.startswith("NonFiniteTrainingError: actor: 2 optimizer steps in a row")
    assert "trainer.max_consecutive_nonfinite=2" in error


def sync_tensors_against_full(rank, world_size, port, model_path):
    """Weight sync's per-unit gather against the per-tensor one, then a training step on the resharded model."""
    worker = TrainerWorker(trainer_config(model_path), rank, world_size, "127.0.0.1", port, total_training_steps=10)
    full = {name: tensor.clone() for name, tensor in worker.iter_policy_tensors()}
    units = [(name, tensor.clone()) for name, tensor in worker.iter_sync_tensors()]
    batch = make_batch()
    spec = PolicyUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    shards, _ = shard_batch(batch, world_size, spec.num_mini_batches)
    metrics = worker.update_actor(shards[rank], spec)  # the model is sharded again and trains
    return ([name for name, _ in units] == list(full),
            all(torch.equal(tensor, full[name]) for name, tensor in units), metrics["actor/grad_norm"])


@pytest.mark.parametrize("world_size", [1, 2])
def test_weight_sync_gather_per_unit_equals_per_tensor_gather(model_path, world_size):
    for same_order, same_values, grad_norm in run_in_processes(sync_tensors_against_full, world_size, model_path):
        assert same_order and same_values
        assert grad_norm > 0


def snapshot_round_trip(rank, world_size, port, model_path):
    """Trains one update, then runs log-probs under the snapshot (decoupled mode's proximal policy) and swaps
    back: returns (live weights before, live weights after, log-probs before training, under the snapshot)."""
    worker = TrainerWorker(trainer_config(model_path, "actor.optim.lr=1e-2"), rank, world_size, "127.0.0.1", port,
                           total_training_steps=10)
    batch = make_batch()
    spec = PolicyUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    shards, _ = shard_batch(batch, world_size, spec.num_mini_batches)
    initial_log_probs, _ = worker.compute_log_prob(shards[rank])
    worker.actor.snapshot()
    worker.update_actor(shards[rank], spec)
    reshard_all(worker.actor.model)
    live_before = worker.policy_state_numpy()
    worker.actor.swap_snapshot()
    snapshot_log_probs, _ = worker.compute_log_prob(shards[rank])  # leaves the root gathered for the swap back
    worker.actor.swap_snapshot()
    reshard_all(worker.actor.model)  # what the next weight sync or optimizer step sees
    return live_before, worker.policy_state_numpy(), initial_log_probs.numpy(), snapshot_log_probs.numpy()


@pytest.mark.parametrize("world_size", [1, 2])
def test_snapshot_swap_computes_with_the_snapshot_and_restores_every_live_weight(model_path, world_size):
    """The swap back comes right after a forward that left FSDP's root unit gathered (embeddings, final norm,
    head): it must reach the fp32 masters, not the gathered copies, or the next reshard brings back the
    snapshot's weights and the update is silently lost."""
    for live_before, live_after, initial_log_probs, snapshot_log_probs in run_in_processes(
            snapshot_round_trip, world_size, model_path):
        assert all(np.array_equal(live_before[name], live_after[name]) for name in live_before)
        assert np.allclose(snapshot_log_probs, initial_log_probs, atol=1e-6)


def deferred_and_direct_gradients(rank, world_size, port, model_path):
    """Two micro-batches' gradients on one rank: reduced after each backward, and deferred to the last. In bf16
    compute, where one rank still has FSDP (its casts); in the masters' dtype one rank trains the plain module."""
    worker = single_worker(model_path, port, "model.dtype=bfloat16")
    model, batch = worker.actor.model, make_batch(seed=2)
    spec = PolicyUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    halves = [batch.select(torch.arange(0, 6)), batch.select(torch.arange(6, 12))]
    results = []
    for defer in (False, True):
        model.zero_grad(set_to_none=True)
        grads_after_first = None
        for index, micro in enumerate(halves):
            defer_gradient_reduction(model, defer=defer and index == 0)
            token_index = response_token_index(micro.response_mask)
            worker.actor.micro_batch_loss(micro, token_index, spec, 40.0, 12.0, MetricSums()).backward()
            if index == 0:
                # Sharded masters (DTensors) holding a reduced gradient; a deferring unit stays gathered.
                grads_after_first = sum(isinstance(p, DTensor) and p.grad is not None for p in model.parameters())
        results.append((grads_after_first, {name: full_tensor(p.grad).clone().numpy() for name, p in model.named_parameters()}))
    return results


def test_deferred_gradient_reduction_on_one_rank_skips_the_first_reduction_and_sums_the_same(model_path):
    (direct, deferred), = run_in_processes(deferred_and_direct_gradients, 1, model_path)
    num_parameters = len(direct[1])
    assert direct[0] == num_parameters  # reduced into the sharded gradients after the first backward
    assert deferred[0] == 0  # deferred: nothing reduced yet, the sum waits in FSDP's unsharded accumulator
    for name, gradient in direct[1].items():
        np.testing.assert_allclose(deferred[1][name], gradient, rtol=0, atol=1e-7, err_msg=name)
    assert all(np.abs(gradient).max() > 0 for gradient in direct[1].values())


def clipped_gradients(rank, world_size, port, model_path, max_norm):
    """Every rank backpropagates the same batch (so the reduced gradient is the one-process gradient), then
    clips: full gradients before and after, and the returned norm."""
    worker = TrainerWorker(trainer_config(model_path), rank, world_size, "127.0.0.1", port, total_training_steps=10)
    model, batch = worker.actor.model, make_batch(seed=4)
    spec = PolicyUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    token_index = response_token_index(batch.response_mask)
    worker.actor.micro_batch_loss(batch, token_index, spec, 40.0, 12.0, MetricSums()).backward()
    before = {name: full_tensor(p.grad).clone().numpy() for name, p in model.named_parameters()}
    norm = float(clip_gradients(model, max_norm))
    after = {name: full_tensor(p.grad).clone().numpy() for name, p in model.named_parameters()}
    return before, norm, after


def policy_wrapping(rank, world_size, port, model_path, dtype):
    worker = TrainerWorker(trainer_config(model_path, f"model.dtype={dtype}"), rank, world_size, "127.0.0.1", port,
                           total_training_steps=10)
    model = worker.actor.model
    return isinstance(model, FSDPModule), any(isinstance(p, DTensor) for p in model.parameters())


@pytest.mark.parametrize("world_size, dtype, wrapped", [(1, "float32", False), (1, "bfloat16", True),
                                                        (2, "float32", True)])
def test_fsdp_wraps_the_policy_only_where_it_shards_or_casts(model_path, world_size, dtype, wrapped):
    """One rank in the masters' own dtype (the CPU default) trains the plain module: FSDP would only copy the
    parameters into gathered buffers and back; two ranks shard, and bf16 compute needs FSDP's casts."""
    for is_fsdp, has_dtensors in run_in_processes(policy_wrapping, world_size, model_path, dtype):
        assert (is_fsdp, has_dtensors) == (wrapped, wrapped)


@pytest.mark.parametrize("world_size", [1, 2])
def test_gradient_clipping_on_shards_equals_the_global_norm_and_scale(model_path, world_size):
    """The norm is the global L2 norm over every full gradient (not one rank's shards), and clipping scales
    each gradient by max_norm / (norm + 1e-6), as torch's clip_grad_norm_."""
    for before, norm, after in run_in_processes(clipped_gradients, world_size, model_path, 0.05):
        expected_norm = np.sqrt(sum(np.square(g.astype(np.float64)).sum() for g in before.values()))
        assert norm == pytest.approx(expected_norm, rel=1e-5)
        assert expected_norm > 0.05  # the clip is active
        scale = 0.05 / (expected_norm + 1e-6)
        for name, gradient in before.items():
            np.testing.assert_allclose(after[name], gradient * scale, rtol=1e-5, atol=1e-9, err_msg=name)
