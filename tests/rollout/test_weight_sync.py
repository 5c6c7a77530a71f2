"""Weight sync through real Ray actors: 2 trainer ranks (FSDP2 over gloo) and 2 rollout replicas.

After every sync each configured replica answers with the model's whole parameter set, each parameter
bitwise equal to the trainer's, the version advances by one, new tokens carry the new version, in-flight
requests survive a sync, and a replica that never joins makes the sync fail within its timeout, naming
that replica.
"""

from __future__ import annotations

import asyncio

import numpy as np
import torch
import pytest
import ray

from asyncrl.config import load_config
from asyncrl.core.records import Sample, samples_to_batch
from asyncrl.core.requests import make_requests
from asyncrl.data.dataset import PromptDataset
from asyncrl.data.make import make_task, write_task
from asyncrl.engine import SamplingParams
from asyncrl.launch.resource_pool import allocate_pools
from asyncrl.launch.runtime import launch_replicas, num_rollout_replicas, pool_specs, rollout_context, start_trainers
from asyncrl.models import CausalLM, build_tiny_model, load_model, load_tokenizer, read_config
from asyncrl.remote import RemoteTimeoutError
from asyncrl.rollout import ReplicaSet, RolloutContext, resolve_backend
from asyncrl.rollout.replica import RolloutReplica, RolloutReplicaActor
from asyncrl.train import PolicyUpdateSpec


def start_setup(tmp_path_factory, trainer_ranks: int, tie_word_embeddings: bool = True, family: str = "qwen2"):
    root = tmp_path_factory.mktemp("sync")
    model = build_tiny_model(root / "model", family=family, seed=1, tie_word_embeddings=tie_word_embeddings)
    paths = write_task(make_task("arithmetic"), root / "data", 16, 4, seed=0)
    config = load_config(None, [
        f"model.path={model}", f"data.train_files=[{paths['train']}]", "trainer.device=cpu",
        "trainer.mode=one_step_off", f"trainer.n_gpus_per_node={trainer_ranks}", "rollout.n_gpus_per_node=2",
        "rollout.n=2",
        "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "actor.optim.lr=1e-2",
        "data.max_response_length=6", "rollout.cpu_kv_cache_mb=8", "weight_sync.bucket_mb=1",
        "weight_sync.timeout_s=20", "ray.rpc_timeout_s=120"])
    trainers, rollout, pools = start_replica_set(config)
    prompts = PromptDataset.from_files(config.data.train_files, load_tokenizer(model), config.data).prompts[:4]
    return config, trainers, rollout, prompts, pools


def start_replica_set(config):
    """The config's trainer ranks and a `ReplicaSet` over its rollout replicas, joined in their weight group."""
    pools = allocate_pools(pool_specs(config, resolve_backend(config)))
    trainers = start_trainers(config, pools, total_steps=10, host_engine=False)
    rollout = ReplicaSet(rollout_context(config, pools, launch_replicas(config, pools, RolloutReplicaActor), trainers))
    return trainers, rollout, pools


def stop_setup(trainers, rollout, pools) -> None:
    rollout.close()
    for actor in trainers.actors:
        ray.kill(actor)
    pools.release()


@pytest.fixture(scope="module")
def setup(tmp_path_factory, ray_session):
    """Two trainer ranks: tensors are gathered per FSDP unit and streamed into the buckets."""
    config, trainers, rollout, prompts, pools = start_setup(tmp_path_factory, trainer_ranks=2)
    yield config, trainers, rollout, prompts
    stop_setup(trainers, rollout, pools)


def train_one_step(config, trainers, rollout, prompts, salt):
    requests = make_requests(prompts, 2, SamplingParams(max_new_tokens=6), 0, salt)
    results = rollout.start_generate(requests).results()
    samples = [Sample(prompts[index // 2], index // 2, index % 2, result).with_reward(float(index % 2), {}, None)
               for index, result in enumerate(results)]
    batch = samples_to_batch(samples)
    batch = batch.replace(old_log_probs=batch.rollout_log_probs, advantages=(batch.token_level_scores.sum(1, keepdim=True)
                                                                              - 0.5) * batch.response_mask)
    trainers.update_actor(batch, PolicyUpdateSpec.from_config(config, batch.num_rows, 0))
    return results


def assert_engines_equal_trainer(config, trainers, rollout, version):
    assert_states_equal(config, trainers.policy_state(), rollout.engine_states(), version)


def assert_states_equal(config, trainer_state: dict[str, np.ndarray], engine_states: list[dict[str, np.ndarray]],
                        version: int) -> None:
    """Every configured replica answered, at `version`, with exactly the policy's parameters, each bitwise
    equal to the trainer's. The parameters are the model's own: a model whose config ties the head to the
    embedding has no `lm_head.weight` on either side, any other must have it on both."""
    model_config, _ = read_config(config.model.path)
    with torch.device("meta"):
        names = {name for name, _ in CausalLM(model_config).named_parameters()}
    assert ("lm_head.weight" in names) != model_config.tie_word_embeddings
    assert set(trainer_state) == names, sorted(names ^ set(trainer_state))
    assert len(engine_states) == num_rollout_replicas(config, resolve_backend(config))
    for replica, state in enumerate(engine_states):
        assert int(state["__version__"]) == version, replica
        assert set(state) - {"__version__"} == names, (replica, sorted(names ^ (set(state) - {"__version__"})))
        for name in names:
            assert np.array_equal(state[name], trainer_state[name]), (replica, name)


def without_head(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: array for name, array in state.items() if name != "lm_head.weight"}


def is_rejected(config, trainer_state: dict[str, np.ndarray], engine_states: list[dict[str, np.ndarray]],
                version: int) -> bool:
    try:
        assert_states_equal(config, trainer_state, engine_states, version)
    except AssertionError:
        return True
    return False


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_the_equality_check_fails_a_missing_head_a_missing_replica_and_a_different_bit(tmp_path, tied):
    model = build_tiny_model(tmp_path / "model", family="qwen2", seed=1, tie_word_embeddings=tied)
    config = load_config(None, [f"model.path={model}", "trainer.device=cpu", "trainer.mode=one_step_off",
                                "rollout.n_gpus_per_node=2"])
    trainer_state = {name: tensor.detach().numpy() for name, tensor in load_model(model).named_parameters()}
    engine = {**trainer_state, "__version__": np.int64(3)}
    assert_states_equal(config, trainer_state, [engine, engine], 3)
    norm = engine["model.norm.weight"]
    wrong = {
        "one replica answered": ([engine], 3),
        "another version": ([engine, engine], 4),
        "one bit off": ([engine, {**engine, "model.norm.weight": np.nextafter(norm, np.float32(2))}], 3),
        "a tensor too many": ([engine, {**engine, "extra.weight": norm}], 3),
    }
    if not tied:
        wrong["no head"] = ([engine, without_head(engine)], 3)
    assert [case for case, (engines, version) in wrong.items()
            if not is_rejected(config, trainer_state, engines, version)] == []
    # The trainer is held to the model's parameters too.
    wrong_trainer = {**trainer_state, "lm_head.weight": norm} if tied else without_head(trainer_state)
    assert is_rejected(config, wrong_trainer, [engine, engine], 3)


def test_every_sync_makes_engines_bitwise_equal_and_bumps_the_version(setup):
    config, trainers, rollout, prompts = setup
    for version in (1, 2, 3):
        before = trainers.policy_state()
        results = train_one_step(config, trainers, rollout, prompts, f"sync{version}")
        assert all(set(result.response_versions.tolist()) == {version - 1} for result in results)
        after = trainers.policy_state()
        assert any(not np.array_equal(before[name], after[name]) for name in before)  # training moved weights
        rollout.sync_weights(version)
        assert_engines_equal_trainer(config, trainers, rollout, version)
    new = rollout.start_generate(make_requests(prompts, 2, SamplingParams(max_new_tokens=6), 0, "after")).results()
    assert all(set(result.response_versions.tolist()) == {3} for result in new)


def test_sync_while_requests_are_in_flight_completes_and_they_finish(setup):
    config, trainers, rollout, prompts = setup
    version = rollout.version + 1
    budget = 40
    pending = rollout.start_generate(make_requests(prompts, 2, SamplingParams(max_new_tokens=budget, ignore_eos=True),
                                                   0, "inflight"))
    rollout.sync_weights(version)
    results = pending.results()
    assert all(result.num_response_tokens == budget for result in results)
    assert all(result.finish_reason == "length" for result in results)
    stamped = set(np.concatenate([result.response_versions for result in results]).tolist())
    assert stamped <= {version - 1, version}
    assert_engines_equal_trainer(config, trainers, rollout, version)


@ray.remote
class StuckReplica(RolloutReplica):
    """A replica that joins the group but never takes part in a transfer."""

    async def receive_weights(self, version):
        await asyncio.sleep(3600)


def test_a_replica_that_never_joins_the_transfer_fails_the_sync_in_time_naming_it(setup, tmp_path):
    config, trainers, _, prompts = setup
    import time
    stuck = StuckReplica.options(num_cpus=0.1).remote(config, 7, 1)
    address = ("127.0.0.1", 29000 + int(time.time()) % 1000)
    rollout = ReplicaSet(RolloutContext(config, trainers, [stuck], torch.float32, lambda: address))
    assert rollout.names == ["rollout/replica7"]  # replicas are named by the index they were started with
    # The trainer's gloo send gives up after the group's 20 s; the wait's deadline comes a second later, so
    # the trainer's transport error arrives first (the order a loaded machine can produce at equal limits):
    # the error must still name the replica that never took part, not the trainer that gave up on it.
    rollout.sync_timeout_s = config.weight_sync.timeout_s + 1
    started = time.monotonic()
    with pytest.raises(RemoteTimeoutError, match="rollout/replica7"):
        rollout.sync_weights(99)
    assert time.monotonic() - started < config.weight_sync.timeout_s + 15
    ray.kill(stuck)
