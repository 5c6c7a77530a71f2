"""Named rollout-correction presets: each name stands for a full setting of ``algorithm.rollout_correction``.

    ROLLOUT_CORRECTION_PRESETS.spec("decoupled_k3_rs").settings()
    # {'bypass_mode': False, 'loss_type': 'ppo_clip', 'rollout_is': None, ..., 'rollout_rs': 'seq_mean_k3',
    #  'rollout_rs_threshold': 0.01, 'rollout_rs_threshold_lower': None}

The names and values are the reference system's (its ``RolloutCorrectionConfig`` class methods, called with their
default arguments), written in our keys: its ratio rejection ``seq_sum_k1`` / ``seq_mean_k1`` with a ``"lo_hi"``
threshold is our level ``sequence`` / ``geometric`` with ``rollout_rs_threshold=hi`` and
``rollout_rs_threshold_lower=lo`` (its k1 criteria bound -l rather than l: the same band when lo = 1/hi, within
1e-6 for its 0.999_1.001). Its IcePop presets (an IS weight zeroed outside [lo, hi] instead of truncated)
have no counterpart here, so they are not listed. Every preset sets every key, ``bypass_mode`` included: the
reference system's presets that do not name it mean decoupled mode (its default), while ours defaults to bypass.

A preset is data, so its registered function only returns ``settings()``; the record carries the settings as
metadata, which the generated reference shows as a table. The name-to-keys table below is the whole definition.
"""

from dataclasses import dataclass, fields
from typing import Any, Callable, Optional

from asyncrl.registry import Entry, Registry, column


@dataclass(frozen=True)
class RolloutCorrectionPreset(Entry):
    """The ``algorithm.rollout_correction`` keys a preset sets, each field named as its key."""

    bypass_mode: bool = column("bypass_mode", False)
    loss_type: str = column("loss_type", "ppo_clip")
    rollout_is: Optional[str] = column("rollout_is", None)
    rollout_is_threshold: float = column("rollout_is_threshold", 2.0)
    rollout_is_batch_normalize: bool = column("rollout_is_batch_normalize", False)
    rollout_rs: Optional[str] = column("rollout_rs", None)
    rollout_rs_threshold: Optional[float] = column("rollout_rs_threshold", None)
    rollout_rs_threshold_lower: Optional[float] = column("rollout_rs_threshold_lower", None)

    def settings(self) -> dict[str, Any]:
        """Key (leaf name under algorithm.rollout_correction) -> value, for every key a preset sets."""
        return {field.name: getattr(self, field.name) for field in fields(self) if "column" in field.metadata}


ROLLOUT_CORRECTION_PRESETS: Registry[RolloutCorrectionPreset] = Registry(
    "rollout-correction preset", RolloutCorrectionPreset)

# The reference system's geometric-mean rejection band (+-0.1% per token on average) and its k3 bound.
_GEO_BAND = dict(rollout_rs="geometric", rollout_rs_threshold=1.001, rollout_rs_threshold_lower=0.999)
_K3_BOUND = dict(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01)
_DECOUPLED = dict(bypass_mode=False)
_BYPASS_PPO = dict(bypass_mode=True, loss_type="ppo_clip")
_BYPASS_PG = dict(bypass_mode=True, loss_type="reinforce")

# name -> (summary, settings); keys not named keep the record's defaults (no IS, no rejection, PPO clip).
_PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "disabled": ("decoupled, no correction: the rollout-vs-proximal diagnostics only", _DECOUPLED),
    "decoupled_token_is": ("decoupled, token IS weights truncated at 2", {**_DECOUPLED, "rollout_is": "token"}),
    "decoupled_seq_is": ("decoupled, sequence IS weights truncated at 2", {**_DECOUPLED, "rollout_is": "sequence"}),
    "decoupled_seq_is_rs": ("decoupled, sequence IS weights truncated at 2, sequences whose ratio leaves "
                            "[0.5, 2] rejected",
                            {**_DECOUPLED, "rollout_is": "sequence", "rollout_rs": "sequence",
                             "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 0.5}),
    "decoupled_geo_rs": ("decoupled, sequences whose geometric-mean ratio leaves [0.999, 1.001] rejected",
                         {**_DECOUPLED, **_GEO_BAND}),
    "decoupled_geo_rs_seq_tis": ("decoupled_geo_rs plus sequence IS weights truncated at 2",
                                 {**_DECOUPLED, **_GEO_BAND, "rollout_is": "sequence"}),
    "decoupled_geo_rs_token_tis": ("decoupled_geo_rs plus token IS weights truncated at 2",
                                   {**_DECOUPLED, **_GEO_BAND, "rollout_is": "token"}),
    "decoupled_k3_rs": ("decoupled, sequences whose mean k3 exceeds 0.01 rejected", {**_DECOUPLED, **_K3_BOUND}),
    "decoupled_k3_rs_seq_tis": ("decoupled_k3_rs plus sequence IS weights truncated at 2",
                                {**_DECOUPLED, **_K3_BOUND, "rollout_is": "sequence"}),
    "decoupled_k3_rs_token_tis": ("decoupled_k3_rs plus token IS weights truncated at 2",
                                  {**_DECOUPLED, **_K3_BOUND, "rollout_is": "token"}),
    "bypass_ppo_clip": ("bypass, PPO clip against the rollout policy (its ratio is the correction)", _BYPASS_PPO),
    "bypass_ppo_clip_geo_rs": ("bypass_ppo_clip, sequences whose geometric-mean ratio leaves [0.999, 1.001] "
                               "rejected", {**_BYPASS_PPO, **_GEO_BAND}),
    "bypass_ppo_clip_k3_rs": ("bypass_ppo_clip, sequences whose mean k3 exceeds 0.01 rejected",
                              {**_BYPASS_PPO, **_K3_BOUND}),
    "bypass_pg_is": ("bypass, REINFORCE with sequence IS weights truncated at 2",
                     {**_BYPASS_PG, "rollout_is": "sequence"}),
    "bypass_pg_geo_rs": ("bypass, REINFORCE, sequences whose geometric-mean ratio leaves [0.999, 1.001] rejected",
                         {**_BYPASS_PG, **_GEO_BAND}),
    "bypass_pg_geo_rs_seq_tis": ("bypass_pg_geo_rs plus sequence IS weights truncated at 2",
                                 {**_BYPASS_PG, **_GEO_BAND, "rollout_is": "sequence"}),
    "bypass_pg_geo_rs_token_tis": ("bypass_pg_geo_rs plus token IS weights truncated at 2",
                                   {**_BYPASS_PG, **_GEO_BAND, "rollout_is": "token"}),
}


def _settings_function(name: str) -> Callable[[], dict[str, Any]]:
    def settings() -> dict[str, Any]:
        return ROLLOUT_CORRECTION_PRESETS.spec(name).settings()

    return settings


for _name, (_summary, _settings) in _PRESETS.items():
    ROLLOUT_CORRECTION_PRESETS.register(_name, summary=_summary, **_settings)(_settings_function(_name))
