"""Growing and shrinking a running replica set: the control a user writes, and how a new replica is placed.

    asyncrl scale RUN_DIR --replicas 3      # writes RUN_DIR/scale.json; the run applies it at its next weight sync

The run reads the file at every weight sync, while its rollout is paused: growing launches replicas on any node
of the Ray cluster with a free device (outside the start's placement group, which holds only the first ones),
waits for them, and brings them into the new weight group, so their first tokens carry the version of that sync;
shrinking drains the replicas it removes (their requests in flight finish first) and stops them. A request the
cluster cannot host in time is logged and the run goes on with the replicas it has.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import ray

from asyncrl.config import AsyncRLConfig

logger = logging.getLogger(__name__)

SCALE_FILE = "scale.json"


def request_scale(run_dir: str | Path, num_replicas: int) -> Path:
    """Writes the request (atomically: a run reading it never sees half a file)."""
    if num_replicas < 1:
        raise ValueError(f"--replicas must be at least 1, got {num_replicas}")
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.yaml): pass the run's trainer.output_dir")
    path = run_dir / SCALE_FILE
    partial = path.with_suffix(".json.tmp")
    partial.write_text(json.dumps({"replicas": num_replicas}) + "\n")
    os.replace(partial, path)
    return path


def read_scale_request(run_dir: str | Path) -> Optional[int]:
    """The number of replicas asked for, or None when nothing is asked; a malformed file is logged, naming it, and
    ignored (the run goes on as it is)."""
    path = Path(run_dir) / SCALE_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        value = json.loads(text)["replicas"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"replicas must be a whole number >= 1, got {value!r}")
        return value
    except (ValueError, KeyError, TypeError) as error:
        logger.warning("%s: ignored (%s); write it with `asyncrl scale RUN_DIR --replicas N`", path, error)
        return None


@dataclass(frozen=True)
class ReplicaLauncher:
    """Starts one more replica actor of the run's backend, named by its index, on any node with a free device
    (a GPU, or on CPU a share of the cores that are free); `launch(index)` returns the actor without waiting."""
    replica_actor: Any
    config: AsyncRLConfig
    num_gpus: float
    num_cpus: float
    node_resource: str = ""

    def launch(self, index: int) -> Any:
        num_cpus = self.num_cpus
        if not self.num_gpus:
            # A CPU slot is a share of the cores: take what is free now, up to the start's share.
            num_cpus = round(max(0.01, min(self.num_cpus, 0.9 * ray.available_resources().get("CPU", 0.0))), 3)
        options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": self.num_gpus,
                                   "max_restarts": self.config.rollout.max_replica_restarts, "max_task_retries": 0}
        if self.node_resource:
            options["resources"] = {self.node_resource: 0.001}
        return self.replica_actor.options(**options).remote(self.config, index, 1)


Launch = Callable[[int], Any]
