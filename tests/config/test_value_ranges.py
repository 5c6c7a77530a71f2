"""Every key's range is checked when the config loads, before Ray: floats are finite whatever the key, ints fit
in 64 bits, and the keys that failed only inside a worker (top_k=0, betas outside [0, 1), a fractional
ray.num_cpus, an oversized block, an endless timeout) fail here naming the key, the value and what is allowed."""

import dataclasses
import re
import typing

import pytest

from asyncrl.config import AsyncRLConfig, ConfigError, load_config
from asyncrl.config.limits import MAX_BLOCK_SIZE, MAX_WAIT_S


def leaf_fields(cls, prefix=""):
    """(dotted key, annotation) of every leaf of the schema."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[field.name]):
            yield from leaf_fields(hints[field.name], f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{field.name}", hints[field.name]


def base_type(annotation):
    """float for `float`, `Optional[float]` and `list[float]`; likewise int."""
    arguments = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    return arguments[0] if arguments else annotation


FLOAT_KEYS = [key for key, annotation in leaf_fields(AsyncRLConfig) if base_type(annotation) is float]
INT_KEYS = [key for key, annotation in leaf_fields(AsyncRLConfig) if base_type(annotation) is int]


def test_the_schema_walk_finds_the_numeric_keys():
    assert {"actor.entropy_coeff", "actor.optim.betas", "reward.max_batch_s", "ray.rpc_timeout_s"} <= set(FLOAT_KEYS)
    assert {"rollout.top_k", "ray.num_cpus", "reward.max_memory_mb", "data.seed"} <= set(INT_KEYS)


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("spelling", ["nan", ".nan", "inf", ".inf", "-inf", "-.inf"])
def test_every_float_key_refuses_nan_and_infinities_naming_the_key(key, spelling):
    expected = spelling.lstrip(".").replace("-.", "-")
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}(\[0\])?: {expected} is not a finite number; "
                                          r"every float setting must be finite$"):
        load_config(None, [f"{key}=[{spelling}, 0.5]" if key.endswith("betas") else f"{key}={spelling}"])


@pytest.mark.parametrize("key", INT_KEYS)
def test_every_int_key_refuses_a_value_past_64_bits(key):
    # A list of ints (evaluation.pass_k) names the item: key[0].
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}(\[0\])?: {2**64} does not fit in a 64-bit integer"):
        load_config(None, [f"{key}={2**64}"])


def test_a_step_count_of_zero_is_refused_where_minus_one_means_all():
    """trainer.total_steps=0 used to run every epoch, like -1, whatever was meant by it."""
    for key in ("trainer.total_steps", "actor.optim.total_training_steps"):
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: 0 is out of range, must be -1 or >= 1$"):
            load_config(None, [f"{key}=0"])
    assert load_config(None, ["trainer.total_steps=3"]).trainer.total_steps == 3


@pytest.mark.parametrize("key", ["rollout.top_k", "rollout.val_kwargs.top_k"])
def test_top_k_is_minus_one_or_at_least_one(key):
    for value in (0, -2):
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: {value} is out of range, must be -1 or >= 1$"):
            load_config(None, [f"{key}={value}"])
    for value in (-1, 1, 50):
        config = load_config(None, [f"{key}={value}"])
        assert (config.rollout.top_k if key == "rollout.top_k" else config.rollout.val_kwargs.top_k) == value


def test_betas_must_each_lie_in_zero_to_one_and_be_two():
    with pytest.raises(ConfigError, match=r"^actor\.optim\.betas\[0\]: 2\.0 is out of range, must be >= 0\.0, < 1\.0$"):
        load_config(None, ["actor.optim.betas=[2,3]"])
    with pytest.raises(ConfigError, match=r"^critic\.optim\.betas\[1\]: 1\.0 is out of range, must be >= 0\.0, < 1\.0$"):
        load_config(None, ["critic.optim.betas=[0.9, 1.0]"])
    with pytest.raises(ConfigError, match=r"^critic\.optim\.betas must hold two numbers \(beta1, beta2\), "
                                          r"got \[0\.9, 0\.99, 0\.9\]$"):
        load_config(None, ["critic.optim.betas=[0.9, 0.99, 0.9]"])
    assert load_config(None, ["actor.optim.betas=[0.0, 0.95]"]).actor.optim.betas == [0.0, 0.95]


def test_a_learning_rate_of_zero_is_allowed_but_not_a_negative_or_infinite_one():
    assert load_config(None, ["actor.optim.lr=0"]).actor.optim.lr == 0.0  # gradients and metrics only
    with pytest.raises(ConfigError, match=r"^actor\.optim\.lr: -1\.0 is out of range, must be >= 0\.0$"):
        load_config(None, ["actor.optim.lr=-1"])
    with pytest.raises(ConfigError, match=r"^actor\.optim\.lr: inf is not a finite number"):
        load_config(None, ["actor.optim.lr=inf"])


def test_ray_num_cpus_is_a_whole_number_or_null():
    with pytest.raises(ConfigError, match=r"^ray\.num_cpus: expected int, got 1\.5 \(float\)$"):
        load_config(None, ["ray.num_cpus=1.5"])
    with pytest.raises(ConfigError, match=r"^ray\.num_cpus: 0 is out of range, must be > 0$"):
        load_config(None, ["ray.num_cpus=0"])
    assert load_config(None, ["ray.num_cpus=2"]).ray.num_cpus == 2
    assert load_config(None, ["ray.num_cpus=null"]).ray.num_cpus is None


def test_block_size_stops_at_the_largest_block_the_engine_uses():
    with pytest.raises(ConfigError, match=rf"^rollout\.block_size: 4096 is out of range, must be > 0, "
                                          rf"<= {MAX_BLOCK_SIZE}$"):
        load_config(None, ["rollout.block_size=4096"])
    assert load_config(None, [f"rollout.block_size={MAX_BLOCK_SIZE}"]).rollout.block_size == MAX_BLOCK_SIZE


@pytest.mark.parametrize("key", ["ray.rpc_timeout_s", "ray.watchdog_s", "weight_sync.timeout_s", "reward.timeout_s",
                                 "reward.import_timeout_s", "reward.max_batch_s"])
def test_every_timeout_is_positive_and_at_most_the_longest_wait_the_os_takes(key):
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: 1000000000\.0 is out of range, must be > 0\.0, "
                                          rf"<= {MAX_WAIT_S}$"):
        load_config(None, [f"{key}=1e9"])
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: 0\.0 is out of range"):
        load_config(None, [f"{key}=0"])
    load_config(None, [f"{key}={MAX_WAIT_S}"])
    # The bound sits below what poll() takes, 2**31 - 1 milliseconds.
    assert MAX_WAIT_S * 1000 < 2**31 - 1


@pytest.mark.parametrize("key", ["data.seed", "rollout.seed", "trainer.seed"])
def test_seeds_are_non_negative_and_32_bit(key):
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: -1 is out of range, must be >= 0, <= 4294967295$"):
        load_config(None, [f"{key}=-1"])
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: 4294967296 is out of range"):
        load_config(None, [f"{key}={2**32}"])


def test_clip_cov_bounds_must_leave_a_range():
    with pytest.raises(ConfigError, match=r"^actor\.policy_loss\.clip_cov_lb \(6\.0\) must be below "
                                          r"actor\.policy_loss\.clip_cov_ub \(5\.0\)$"):
        load_config(None, ["actor.policy_loss.clip_cov_lb=6"])


def test_values_in_a_yaml_file_are_checked_like_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("actor:\n  entropy_coeff: .nan\n")
    with pytest.raises(ConfigError, match=r"^actor\.entropy_coeff: nan is not a finite number"):
        load_config(path)
