"""vLLM as a rollout replica, for real: a trainer rank and one replica hosting vLLM's CPU build, through Ray.

After every weight sync, vLLM's log-probs of fixed token sequences equal the trainer's within 1e-4 (fp32: they
agree to ~1e-6), generated tokens carry the version of the weights that sampled them and log-probs of the
sampling distribution, and `rollout.vllm.verify_weights` compares checksums of what each replica loaded. The check
is sensitive: weights with one tensor left at its previous value (a tensor a sync skipped) miss it by far.

Needs vLLM (`scripts/vllm_cpu_venv.sh`); skipped where it is not installed. One engine start (~30-60 s on 2 cores).
"""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

from asyncrl.config import ConfigError, load_config
from asyncrl.core.requests import make_requests
from asyncrl.data.dataset import PromptDataset
from asyncrl.data.make import make_task, write_task
from asyncrl.engine import SamplingParams
from asyncrl.launch.resource_pool import allocate_pools
from asyncrl.launch.runtime import launch_replicas, pool_specs, rollout_context, start_trainers
from asyncrl.models import CausalLM, build_tiny_model, load_tokenizer, read_config
from asyncrl.rollout import RolloutError, resolve_backend
from asyncrl.rollout.vllm import VllmReplicaSet
from asyncrl.rollout.vllm.engine_args import vllm_installed
from asyncrl.rollout.vllm.replica import VllmReplicaActor
from asyncrl.train.batch import TrainBatch
from asyncrl.train.forward import response_log_probs
from tests.rollout.test_weight_sync import train_one_step

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(not vllm_installed(), reason="vLLM is not installed here "
                                                    "(bash scripts/vllm_cpu_venv.sh; docs/vllm.md)")]
TOLERANCE = 1e-4
# (prompt ids, response ids) the engine and the trainer score after every sync: fixed, not sampled.
SEQUENCES = [([3, 40, 41, 30, 42, 5], [44, 45, 1]), ([3, 50, 51, 52], [60, 61, 62, 63, 64])]


def vllm_model(folder):
    """The demo's width with heads of 32 dimensions (vLLM's CPU attention runs 32 and up; the demo has 16)."""
    return build_tiny_model(folder, family="qwen2", seed=1, hidden_size=64, num_layers=2, num_heads=2,
                            num_kv_heads=1, max_position_embeddings=64)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, ray_session):
    root = tmp_path_factory.mktemp("vllm")
    model = vllm_model(root / "model")
    paths = write_task(make_task("arithmetic"), root / "data", 16, 4, seed=0)
    config = load_config(None, [
        f"model.path={model}", f"data.train_files=[{paths['train']}]", "trainer.device=cpu",
        "trainer.mode=one_step_off", "rollout.backend=vllm", "rollout.n=2", "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4", "actor.optim.lr=1e-2", "data.max_prompt_length=16",
        "data.max_response_length=8", "rollout.cpu_kv_cache_mb=64", "rollout.vllm.verify_weights=true",
        "weight_sync.timeout_s=60", "ray.rpc_timeout_s=300"])
    backend = resolve_backend(config)
    pools = allocate_pools(pool_specs(config, backend))
    trainers = start_trainers(config, pools, total_steps=10, host_engine=False)
    rollout = VllmReplicaSet(rollout_context(config, pools, launch_replicas(config, pools, VllmReplicaActor),
                                             trainers))
    prompts = PromptDataset.from_files(config.data.train_files, load_tokenizer(model), config.data).prompts[:4]
    yield config, trainers, rollout, prompts
    rollout.close()
    for actor in trainers.actors:
        ray.kill(actor)
    pools.release()


def policy_model(config, state: dict[str, np.ndarray]) -> CausalLM:
    """The policy with the trainer's parameters `state` (fp32, on the CPU)."""
    model_config, _ = read_config(config.model.path)
    model = CausalLM(model_config)
    missing, unexpected = model.load_state_dict({name: torch.tensor(values) for name, values in state.items()},
                                                strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}   # tied to the embedding
    return model


def trainer_log_probs(config, state: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The trainer's log-probs (temperature 1) of SEQUENCES under `state`."""
    model = policy_model(config, state)
    batch = TrainBatch.from_sequences([prompt for prompt, _ in SEQUENCES], [response for _, response in SEQUENCES],
                                      list(range(len(SEQUENCES))))
    with torch.no_grad():
        log_probs, _ = response_log_probs(model, batch, temperature=1.0, with_entropy=False)
    return [log_probs[row, :len(response)].numpy() for row, (_, response) in enumerate(SEQUENCES)]


def engine_log_probs(rollout) -> list[np.ndarray]:
    return ray.get(rollout.replicas[0].score.remote(SEQUENCES))


def max_difference(engine: list[np.ndarray], trainer: list[np.ndarray]) -> float:
    return max(float(np.abs(a - b).max()) for a, b in zip(engine, trainer))


def test_after_every_sync_vllm_scores_fixed_sequences_as_the_trainer_does(setup):
    config, trainers, rollout, prompts = setup
    previous = trainers.policy_state()
    for version in (1, 2, 3):
        rollout.sync_weights(version)   # verify_weights: every replica's checksum equals the trainer's
        state = trainers.policy_state()
        assert max_difference(engine_log_probs(rollout), trainer_log_probs(config, state)) <= TOLERANCE
        results = train_one_step(config, trainers, rollout, prompts, salt=f"sync{version}")
        assert all(set(result.response_versions.tolist()) == {version} for result in results)
        if version > 1:
            # The same comparison with one tensor left at its previous value, as a sync that skipped it would
            # leave the engine: far outside the tolerance.
            skipped = {**state, "model.layers.1.mlp.down_proj.weight": previous["model.layers.1.mlp.down_proj.weight"]}
            assert max_difference(engine_log_probs(rollout), trainer_log_probs(config, skipped)) > 100 * TOLERANCE
        previous = state


def test_sampled_tokens_carry_the_sampling_distributions_log_probs(setup):
    config, trainers, rollout, prompts = setup
    rollout.sync_weights(4)
    state = trainers.policy_state()
    requests = make_requests(prompts[:2], 2, SamplingParams(temperature=0.7, max_new_tokens=6), 0, "temperature")
    results = rollout.start_generate(requests).results()
    model = policy_model(config, state)
    batch = TrainBatch.from_sequences([result.prompt_ids for result in results],
                                      [result.response_ids for result in results], list(range(len(results))))
    with torch.no_grad():
        expected, _ = response_log_probs(model, batch, temperature=0.7, with_entropy=False)
    for row, result in enumerate(results):
        assert result.finish_reason in ("stop", "length") and result.response_ids.size > 0
        assert np.abs(result.response_log_probs - expected[row, :result.response_ids.size].numpy()).max() <= TOLERANCE


def test_verify_weights_names_a_replica_that_holds_other_weights(setup):
    config, trainers, rollout, prompts = setup
    train_one_step(config, trainers, rollout, prompts, salt="drift")   # the trainer moves on; the replica does not
    with pytest.raises(RolloutError, match=r"rollout/replica0: the weights loaded at version 7 differ"):
        rollout.verify_weights(7)


def test_settings_vllm_cannot_honour_fail_before_ray(tmp_path):
    model = vllm_model(tmp_path / "model")
    base = [f"model.path={model}", "trainer.device=cpu", "trainer.mode=fully_async", "rollout.backend=vllm"]
    cases = {
        "rollout.top_p=0.9": r"rollout\.top_p=0\.9 .* after top-p/top-k filtering",
        "rollout.vllm.engine_args=[max_num_batched_tokns=512]":
            r"'max_num_batched_tokns' is not an argument .*; did you mean 'max_num_batched_tokens'\?",
        "rollout.vllm.engine_args=[seed=3]": r"seed is set by asyncrl from trainer\.seed",
        "model.lora_rank=8": r"does not load LoRA adapters in place",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            resolve_backend(load_config(None, [*base, override]))
    demo_shape = build_tiny_model(tmp_path / "demo", family="qwen2", hidden_size=64, num_heads=4, num_kv_heads=2)
    with pytest.raises(ConfigError, match=r"head_dim 16, which vLLM's CPU attention does not run"):
        resolve_backend(load_config(None, [f"model.path={demo_shape}", *base[1:]]))
