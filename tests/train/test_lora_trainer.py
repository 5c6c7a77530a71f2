"""A LoRA policy in trainer workers on real gloo groups: only adapters train and hold optimizer state, the
reference is the base model through the same weights, FSDP2 over two ranks equals one, checkpoints resume
exactly, the engine's log-probs equal the trainer's, and the export loads in peft / transformers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from asyncrl.engine import EngineConfig, GenerationRequest, LLMEngine, SamplingParams
from asyncrl.models import build_tiny_model, load_model
from asyncrl.models.adapted import load_policy
from asyncrl.models.lora import is_adapter_name, lora_spec
from asyncrl.train import PolicyUpdateSpec, TrainBatch, TrainerWorker, shard_batch
from asyncrl.train.forward import batched_log_probs

from .helpers import make_batch, run_in_processes, trainer_config

LR = 5e-2
LORA = ("model.lora_rank=4", "model.lora_alpha=8", f"actor.optim.lr={LR}", "algorithm.use_kl_in_reward=true")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", family="qwen2", seed=3)


def worker_for(model_path, port, rank=0, world_size=1, *overrides):
    return TrainerWorker(trainer_config(model_path, *LORA, *overrides), rank, world_size, "127.0.0.1", port,
                         total_training_steps=10)


def train_and_report(rank, world_size, port, model_path):
    worker = worker_for(model_path, port, rank, world_size)
    batch = make_batch(seed=1)
    base_log_probs, _ = batched_log_probs(load_model(model_path), batch, 1.0, 4, None, False, torch.device("cpu"))
    spec = PolicyUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    shards, _ = shard_batch(batch, world_size, spec.num_mini_batches)
    for _ in range(3):
        metrics = worker.update_actor(shards[rank], spec)
    num_adapter_tensors = sum(1 for name, _ in worker.actor.model.named_parameters() if is_adapter_name(name))
    reference = worker.compute_ref_log_prob(shards[rank])
    policy, _ = worker.compute_log_prob(shards[rank])
    return dict(state=worker.policy_state_numpy(), metrics=metrics, sync_names=worker.sync_tensor_names(),
                num_optimizer_states=len(worker.actor.optimizer.state), num_adapter_tensors=num_adapter_tensors,
                has_reference_copy=worker.reference is not None, reference=reference.numpy(), policy=policy.numpy(),
                base=(base_log_probs if world_size == 1 else base_log_probs[:0]).numpy())


def test_only_adapters_train_and_the_reference_is_the_base_model(model_path):
    (report,) = run_in_processes(train_and_report, 1, model_path)
    initial = {name: tensor.detach().numpy() for name, tensor in load_model(model_path).named_parameters()}
    state = report["state"]
    adapters = sorted(name for name in state if is_adapter_name(name))
    assert len(adapters) == 2 * 7 * 2  # A and B of 7 projections in 2 layers
    for name, weights in initial.items():  # the base is bitwise untouched by three optimizer steps
        assert np.array_equal(state[name], weights), name
    assert all(np.abs(state[name]).max() > 0 for name in adapters if ".lora_B." in name)  # B moved off zero
    assert report["num_optimizer_states"] == report["num_adapter_tensors"] == len(adapters)
    assert not report["has_reference_copy"]
    # The reference (adapters off) is the base model's forward, bit for bit; the trained policy is not.
    assert np.array_equal(report["reference"], report["base"])
    assert np.abs(report["policy"] - report["reference"]).max() > 1e-3
    assert report["sync_names"] == adapters_in_order(state)
    metrics = report["metrics"]
    num_adapter_params = sum(state[name].size for name in adapters)
    assert metrics["lora/trainable_params"] == metrics["actor/trainable_params"] == num_adapter_params
    assert metrics["weight_sync/bytes"] == 4 * num_adapter_params  # fp32 on CPU, adapters only
    # Masters, one gradient and two Adam moments per adapter value (+ Adam's step counters), no reference copy.
    num_base = sum(array.size for array in initial.values())
    expected = 4 * (num_base + num_adapter_params + 3 * num_adapter_params)
    assert expected <= metrics["trainer/state_bytes"] <= expected + 8 * len(adapters)


def adapters_in_order(state):
    return [name for name in state if is_adapter_name(name)]


def test_two_rank_fsdp_equals_one_rank_with_lora(model_path):
    (single,) = run_in_processes(train_and_report, 1, model_path)
    ranks = run_in_processes(train_and_report, 2, model_path)
    # Two ranks reduce each gradient in another float32 order than one rank: ~1e-7 of the tensor's largest
    # entries. AdamW moves each value by lr * m/sqrt(v), a ratio of that value's own gradients, so a value whose
    # gradient is 100-1000x below its tensor's largest (an adapter A behind a small B) sees its ratio, hence its
    # step, change by up to ~1e-3 of lr; the weights then differ and carry it through the 9 steps (3 updates of
    # 3 mini-batches). Measured on a 2-core x86 VM: max 1.16e-5 (2.3e-4 lr), mean 4.2e-7 over 11,264 adapter
    # values. A lost rank (one half of the batch trained) differs by mean 0.16, max 0.65: ~3 lr.
    for report in ranks:  # the base weights are not trained (the first test): the adapters' differences
        differences = np.concatenate([np.abs(report["state"][name] - array).ravel()
                                      for name, array in single["state"].items() if is_adapter_name(name)])
        assert differences.max() <= 1e-3 * LR and differences.mean() <= 4e-5 * LR, (differences.max(),
                                                                                    differences.mean())
        assert report["metrics"]["lora/trainable_params"] == single["metrics"]["lora/trainable_params"]


def resume_run(rank, world_size, port, model_path, folder, phase):
    worker = worker_for(model_path, port)
    batch = make_batch(seed=2)
    spec = PolicyUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    if phase == "resume":
        worker.load_checkpoint(folder)
    for _ in range(4 if phase == "straight" else 2):
        worker.update_actor(batch, spec)
    if phase == "first_half":
        worker.save_checkpoint(folder)
    return worker.policy_state_numpy()


def test_checkpoint_holds_adapters_and_their_optimizer_state(model_path, tmp_path):
    folder = tmp_path / "ckpt"
    (straight,) = run_in_processes(resume_run, 1, model_path, folder, "straight")
    run_in_processes(resume_run, 1, model_path, folder, "first_half")
    (resumed,) = run_in_processes(resume_run, 1, model_path, folder, "resume")
    for name in straight:
        assert np.array_equal(resumed[name], straight[name]), name


def engine_against_trainer(rank, world_size, port, model_path, export_folder):
    worker = worker_for(model_path, port, 0, 1, "rollout.temperature=1.0")
    batch = make_batch(seed=3)
    spec = PolicyUpdateSpec.from_config(worker.config, batch.num_rows, step=0)
    for _ in range(2):
        worker.update_actor(batch, spec)
    engine = LLMEngine(load_policy(model_path, lora_spec(worker.config), torch.float32, torch.device("cpu")),
                       EngineConfig(device="cpu", num_kv_blocks=64))
    num_loaded = engine.update_weights(worker.iter_sync_tensors(), version=1)
    engine_state = {name: tensor.detach().numpy().copy() for name, tensor in engine.model.named_parameters()}
    requests = [GenerationRequest(f"r{index}", [5 + index, 17, 30 + index],
                                  SamplingParams(max_new_tokens=6, temperature=1.0, seed=index))
                for index in range(4)]
    results = engine.generate(requests)
    generated = TrainBatch.from_sequences([result.prompt_ids.tolist() for result in results],
                                          [result.response_ids.tolist() for result in results], list(range(4)))
    trainer_log_probs, _ = worker.compute_log_prob(generated)
    rollout_log_probs = [result.response_log_probs.tolist() for result in results]
    worker.export_policy(export_folder)
    return (worker.policy_state_numpy(), engine_state, num_loaded, generated.to_numpy(), trainer_log_probs.numpy(),
            rollout_log_probs)


def test_engine_with_synced_adapters_equals_the_trainer_and_the_export_loads(model_path, tmp_path):
    peft = pytest.importorskip("peft", reason="peft is in the dev extra: pip install -e .[dev]")
    export = tmp_path / "policy"
    (trainer_state, engine_state, num_loaded, arrays, trainer_log_probs, rollout_log_probs), = run_in_processes(
        engine_against_trainer, 1, model_path, export)
    assert num_loaded == len(adapters_in_order(trainer_state))  # the sync moved the adapters and nothing else
    assert set(engine_state) == set(trainer_state)
    for name, array in trainer_state.items():
        assert np.array_equal(engine_state[name], array), name
    batch = TrainBatch.from_numpy(arrays)
    mask = batch.response_mask.bool()
    rollout = torch.zeros(mask.shape)
    for row, values in enumerate(rollout_log_probs):
        rollout[row, :len(values)] = torch.tensor(values)
    assert int(mask.sum()) == sum(len(values) for values in rollout_log_probs) > 0
    assert (rollout[mask] - torch.from_numpy(trainer_log_probs)[mask]).abs().max() <= 1e-5
    # The PEFT adapter on the base model and the merged folder both give the trained policy's logits.
    ours = load_policy(model_path, lora_spec(trainer_config(model_path, *LORA)), torch.float32, torch.device("cpu"))
    ours.load_state_dict({name: torch.from_numpy(array) for name, array in trainer_state.items()}, strict=False)
    input_ids = batch.input_ids[:, :8]
    positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
    with torch.no_grad():
        expected = ours.compute_logits(ours(input_ids, positions))
        base = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        adapted = peft.PeftModel.from_pretrained(base, export / "adapter").eval()
        assert (adapted(input_ids=input_ids).logits - expected).abs().max() <= 1e-5
        merged = transformers.AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
        assert (merged(input_ids=input_ids).logits - expected).abs().max() <= 1e-4
        untrained = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        assert (untrained(input_ids=input_ids).logits - expected).abs().max() > 1e-3


def checkpoint_files(rank, world_size, port, model_path, folder):
    worker = worker_for(model_path, port)
    worker.save_checkpoint(folder)
    return None


def test_a_lora_checkpoint_holds_the_adapters_not_the_base(model_path, tmp_path):
    run_in_processes(checkpoint_files, 1, model_path, tmp_path / "ckpt")
    with safe_open(str(tmp_path / "ckpt" / "rank_0.safetensors"), framework="pt") as handle:
        names = list(handle.keys())
    assert any("lora_A" in name for name in names)
    # Neither the frozen base weights nor optimizer state for them: the base comes from model.path on resume.
    assert not any("embed_tokens" in name or name.endswith("q_proj.weight") for name in names), names[:5]
