"""The rollout backend registry: `rollout.backend` names an entry (auto: the mode's default), a misspelled
name is answered with the closest registered one, and a backend whose engines live in the trainer ranks is
refused by the modes that overlap generation with training."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.rollout import ROLLOUT_BACKENDS, ColocatedRollout, ReplicaSet, resolve_backend


def test_the_shipped_backends_carry_their_placement():
    assert [(spec.name, spec.fn, spec.placement) for spec in ROLLOUT_BACKENDS.specs()][:2] == [
        ("colocated", ColocatedRollout, "colocated"), ("ray_replicas", ReplicaSet, "separate")]
    assert all(spec.summary for spec in ROLLOUT_BACKENDS.specs())


@pytest.mark.parametrize("mode, expected", [("sync", "colocated"), ("one_step_off", "ray_replicas"),
                                            ("fully_async", "ray_replicas")])
def test_auto_keeps_each_modes_backend(mode, expected):
    assert resolve_backend(load_config(None, [f"trainer.mode={mode}"])).name == expected


def test_a_named_backend_is_taken_and_a_typo_names_the_closest():
    assert resolve_backend(load_config(None, ["rollout.backend=ray_replicas"])).fn is ReplicaSet
    with pytest.raises(ConfigError, match=r"rollout\.backend: unknown rollout backend 'ray_replica'; did you mean "
                                          r"'ray_replicas'\? valid names: colocated, ray_replicas"):
        resolve_backend(load_config(None, ["rollout.backend=ray_replica"]))


@pytest.mark.parametrize("mode", ["one_step_off", "fully_async"])
def test_the_separated_modes_refuse_engines_inside_the_trainer_ranks(mode):
    config = load_config(None, [f"trainer.mode={mode}", "rollout.backend=colocated"])
    with pytest.raises(ConfigError, match=rf"rollout\.backend=colocated .* trainer\.mode={mode} cannot overlap with "
                                          r"training; use a backend on its own devices \(ray_replicas"):
        resolve_backend(config)


@pytest.mark.parametrize("mode, backend, says", [
    ("sync", "colocated", "copies the weights into its engines in process"),
    ("one_step_off", "external", "has its servers reload the weights from a folder"),
    ("one_step_off", "vllm", "vLLM loads whole tensors through its own loader")])
def test_sparse_weight_sync_is_refused_where_no_replica_applies_deltas(mode, backend, says):
    config = load_config(None, [f"trainer.mode={mode}", f"rollout.backend={backend}", "weight_sync.encoding=sparse",
                                "rollout.external.urls=[http://127.0.0.1:1]"])
    with pytest.raises(ConfigError, match=rf"{says}.*use weight_sync\.encoding=auto"):
        resolve_backend(config)


def test_sparse_weight_sync_is_taken_by_the_ray_replicas():
    config = load_config(None, ["trainer.mode=one_step_off", "weight_sync.encoding=sparse"])
    assert resolve_backend(config).name == "ray_replicas"
