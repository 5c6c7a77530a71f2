"""The rollout backends, each registered next to its definition with its own metadata, and the one record
every backend is built from.

    @ROLLOUT_BACKENDS.register("my_server", placement="external", summary="...")
    class MyServerRollout(RolloutBackend):
        def __init__(self, context: RolloutContext): ...

    spec = resolve_backend(config)          # rollout.backend (auto: by trainer.mode), checked against the mode
    rollout = spec.fn(context)               # the composition root does this once

Placement says where a backend's engines run, which decides what the composition root reserves and starts:
`colocated` engines live in the trainer ranks (which then host one each); `separate` engines are Ray replica
actors on devices of their own (the rollout pool, `rollout.n_gpus_per_node` x `rollout.nnodes`, started before
the backend is built, in `context.replicas`); an `external` backend brings its own (an HTTP server, an engine
in the driver's process) and nothing is reserved for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Protocol

import numpy as np
import torch

from asyncrl.registry import Entry, Registry, column
from asyncrl.config import AsyncRLConfig, ConfigError

Placement = Literal["colocated", "separate", "external"]

# Where each mode may generate: the separated modes overlap generation with training, which engines that
# live in the trainer ranks cannot do.
MODE_PLACEMENTS: dict[str, tuple[Placement, ...]] = {
    "sync": ("colocated", "separate", "external"),
    "one_step_off": ("separate", "external"),
    "fully_async": ("separate", "external"),
}
# How weights reach a backend's engines where no weight group carries them (weight_sync.encoding's errors).
PLACEMENT_SYNC = {"colocated": "copies the weights into its engines in process",
                  "external": "has its servers reload the weights from a folder"}
DEFAULT_BACKENDS = {"sync": "colocated", "one_step_off": "ray_replicas", "fully_async": "ray_replicas"}


@dataclass(frozen=True)
class RolloutBackendSpec(Entry):
    placement: Placement = column("placement", "separate")
    # A `separate` backend's Ray actor class, one launched per rollout device (`replica.py`'s interface).
    replica: Any = column("replica actor", None)
    # What the backend needs of the config and the machine, checked before Ray starts (raises ConfigError).
    check: Optional[Callable[[AsyncRLConfig], None]] = column("pre-flight check", None)


ROLLOUT_BACKENDS: Registry[RolloutBackendSpec] = Registry("rollout backend", RolloutBackendSpec)


class TrainerRanks(Protocol):
    """The trainer ranks as a backend reaches them at a weight sync (`asyncrl.core.TrainerGroup`): their Ray
    actors (`asyncrl.core.trainer_rank.TrainerRank`: `join_weight_group`, `send_weights`, and with a colocated
    engine `generate`, `sync_local_engine`, `sleep_engine`, `wake_engine`), and whole-policy reads."""
    actors: list[Any]
    names: list[str]
    timeout_s: float

    def policy_state(self) -> dict[str, np.ndarray]:
        """Every policy parameter, gathered, as numpy (small models, tests)."""
        ...

    def export_policy(self, folder: str) -> None:
        """The policy as an HF checkpoint folder (a server reloads it from disk)."""
        ...


@dataclass
class RolloutContext:
    """What every backend is built from (one record: every entry of the registry takes the same argument)."""
    config: AsyncRLConfig
    trainers: TrainerRanks
    replicas: list[Any]                              # Ray replica actors of a `separate` backend, else []
    engine_dtype: torch.dtype                        # the dtype replicas' engines hold weights in
    weight_address: Callable[[], tuple[str, int]]    # a fresh (host, port) on trainer rank 0's node
    # Starts one more replica actor by index, on any node with a free device (growing a `separate` backend while
    # it runs: `elastic.py`); None where the replicas cannot grow.
    launch_replica: Optional[Callable[[int], Any]] = None


def resolve_backend(config: AsyncRLConfig) -> RolloutBackendSpec:
    """`rollout.backend`'s entry (auto: the mode's default), checked against `trainer.mode`; a ConfigError
    names a misspelled backend's closest registered name."""
    mode = config.trainer.mode
    name = DEFAULT_BACKENDS[mode] if config.rollout.backend == "auto" else config.rollout.backend
    if name not in ROLLOUT_BACKENDS:
        raise ConfigError(f"rollout.backend: {ROLLOUT_BACKENDS.unknown_name_message(name)}")
    spec = ROLLOUT_BACKENDS.spec(name)
    if spec.placement == "separate" and spec.replica is None:
        raise ConfigError(f"rollout.backend={name} runs replicas on devices of their own but registered no replica "
                          f"actor class (ROLLOUT_BACKENDS.register(..., replica=...))")
    if spec.placement not in MODE_PLACEMENTS[mode]:
        raise ConfigError(f"rollout.backend={name} runs its engines {spec.placement} (in the trainer ranks), which "
                          f"trainer.mode={mode} cannot overlap with training; use a backend on its own devices "
                          f"({', '.join(s.name for s in ROLLOUT_BACKENDS.specs() if s.placement != 'colocated')})")
    if config.weight_sync.encoding == "sparse" and spec.placement != "separate":
        raise ConfigError(f"weight_sync.encoding=sparse sends deltas to Ray replicas over their weight group; "
                          f"rollout.backend={name} {PLACEMENT_SYNC[spec.placement]}: use weight_sync.encoding=auto")
    if spec.check is not None:
        spec.check(config)
    return spec
