"""The batch rules hold in every mode over the prompts one step trains: data.train_batch_size in sync and
one_step_off, R = actor.ppo_mini_batch_size x async_training.require_batches in fully_async."""

import pytest

from asyncrl.config import ConfigError, load_config, prompts_per_step, step_meaning


def test_prompts_per_step_is_the_batch_or_r_by_mode():
    batch = ["data.train_batch_size=32", "actor.ppo_mini_batch_size=8", "async_training.require_batches=2"]
    assert prompts_per_step(load_config(None, [*batch, "trainer.mode=sync"])) == 32
    assert prompts_per_step(load_config(None, [*batch, "trainer.mode=one_step_off"])) == 32
    assert prompts_per_step(load_config(None, [*batch, "trainer.mode=fully_async"])) == 16



def test_a_step_is_stated_per_mode_with_its_prompts_updates_and_weight_pushes():
    batch = ["data.train_batch_size=32", "actor.ppo_mini_batch_size=8", "async_training.require_batches=2",
             "rollout.n=4", "actor.ppo_epochs=2", "async_training.trigger_parameter_sync_step=3"]
    assert step_meaning(load_config(None, [*batch, "trainer.mode=one_step_off"])) == (
        "a one_step_off step trains data.train_batch_size = 32 prompts x rollout.n = 4 responses, in 8 optimizer "
        "updates (mini-batches of actor.ppo_mini_batch_size = 8 prompts, actor.ppo_epochs = 2); the weights are "
        "pushed after every step")
    assert step_meaning(load_config(None, [*batch, "trainer.mode=fully_async"])) == (
        "a fully_async step trains R = actor.ppo_mini_batch_size x async_training.require_batches = 8 x 2 = 16 "
        "prompts from the rollouter's queue x rollout.n = 4 responses, in 4 optimizer updates (mini-batches of "
        "actor.ppo_mini_batch_size = 8 prompts, actor.ppo_epochs = 2); the weights are pushed every "
        "async_training.trigger_parameter_sync_step = 3 steps")

@pytest.mark.parametrize("mode", ["sync", "one_step_off"])
def test_an_actor_mini_batch_larger_than_the_batch_is_refused_where_the_batch_is_the_step(mode):
    with pytest.raises(ConfigError, match=r"^actor\.ppo_mini_batch_size must divide data\.train_batch_size, got 32 "
                                          r"and 8: each step's prompts split into whole mini-batches, one optimizer "
                                          r"step each$"):
        load_config(None, [f"trainer.mode={mode}", "data.train_batch_size=8", "actor.ppo_mini_batch_size=32"])


def test_in_fully_async_the_mini_batch_makes_the_step_so_it_is_never_larger_than_it():
    config = load_config(None, ["trainer.mode=fully_async", "data.train_batch_size=8", "actor.ppo_mini_batch_size=32",
                                "async_training.require_batches=2"])
    assert prompts_per_step(config) == 64  # data.train_batch_size sizes nothing here


def test_the_critic_mini_batch_must_divide_the_step_in_every_mode():
    critic = ["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=12", "actor.ppo_mini_batch_size=8"]
    with pytest.raises(ConfigError, match=r"^critic\.ppo_mini_batch_size \(12\) must divide data\.train_batch_size "
                                          r"\(16\): each step's prompts split into whole critic mini-batches$"):
        load_config(None, [*critic, "trainer.mode=sync", "data.train_batch_size=16"])
    with pytest.raises(ConfigError, match=r"^critic\.ppo_mini_batch_size \(12\) must divide the prompts of a "
                                          r"fully_async step, actor\.ppo_mini_batch_size x "
                                          r"async_training\.require_batches = 16: each step's prompts split into "
                                          r"whole critic mini-batches$"):
        load_config(None, [*critic, "trainer.mode=fully_async", "async_training.require_batches=2"])
    load_config(None, [*critic, "trainer.mode=fully_async", "async_training.require_batches=3"])  # R = 24


def test_fully_async_keys_that_ask_for_stale_samples_are_refused_elsewhere_but_queue_shape_keys_are_not():
    with pytest.raises(ConfigError, match=r"^async_training\.partial_rollout / staleness_threshold only apply to "
                                          r"trainer\.mode=fully_async, got trainer\.mode=one_step_off with "
                                          r"partial_rollout=False, staleness_threshold=0\.5$"):
        load_config(None, ["trainer.mode=one_step_off", "async_training.staleness_threshold=0.5"])
    # One config runs in every mode (asyncrl bench modes): K, require_batches and concurrency are unused in sync.
    load_config(None, ["trainer.mode=sync", "async_training.require_batches=2",
                       "async_training.trigger_parameter_sync_step=2", "async_training.max_concurrent_samples=8"])
