"""The `algorithm.distillation` section of the config tree (on-policy distillation from a teacher model, see
docs/distillation.md); `schema.py` places it under `algorithm`."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config.fields import option
from asyncrl.config.limits import MAX_WAIT_S


@dataclass
class DistillationConfig:
    enable: bool = option(
        False, "on-policy distillation (every mode): a teacher model scores every trained response's tokens, and "
               "coef x (teacher log-prob - student log-prob) of each token, the negative of a sampled reverse KL, "
               "is added to the token's advantage")
    teacher_path: str = option(
        "", "HF folder of the teacher (any supported family and size); its tokenizer must be the student's (the "
            "run is refused at start otherwise)")
    coef: float = option(1.0, "weight of the teacher's per-token signal in the advantage", gt=0.0)
    task_reward_weight: float = option(
        0.0, "weight of the advantage estimator's advantage (from the task reward) next to the teacher's signal: 0 "
             "trains on the teacher alone (the reward is still computed and logged), 1 adds the two", ge=0.0)
    num_workers: int = option(1, "teacher actors; each batch of responses is split among them", gt=0)
    num_cpus_per_worker: float = option(0.1, "CPUs Ray reserves for each teacher actor (a fraction on CPU)", gt=0.0)
    num_gpus_per_worker: float = option(
        0.0, "GPU share of each teacher actor: 1 = a device of its own, a fraction to share one the trainer and "
             "rollout pools do not hold; 0 runs the teacher on CPU", ge=0.0, le=1.0)
    micro_batch_size_per_gpu: int = option(32, "responses per teacher forward pass", gt=0)
    timeout_s: float = option(
        120.0, "limit on one scoring call to the teacher actors; the responses of an actor past it get no teacher "
               "signal (counted in distillation/teacher_timeouts) and the actor is restarted", gt=0.0,
        le=MAX_WAIT_S)
