"""The `evaluation` section of the config tree: evaluation as its own stage, on evaluator actors that hold a pinned
policy version while training goes on (docs/evaluation.md); `schema.py` assembles the tree."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config.fields import option
from asyncrl.config.limits import MAX_WAIT_S


@dataclass
class EvaluationConfig:
    enable: bool = option(
        False, "evaluate the policy every `freq` versions on evaluator actors of its own, which receive the version's "
               "weights and generate while training goes on (every mode); results are logged under the version they "
               "measured (val/param_version) and summary.json keeps the best and the last. trainer.test_freq's "
               "validation on the rollout keeps working beside it")
    data_files: list[str] = option([], "evaluation prompt files (.parquet or .jsonl, verl schema); empty = "
                                       "data.val_files")
    freq: int = option(1, "evaluate every N policy versions (and version 0 before training, and the last one)", gt=0)
    n: int = option(1, "samples per prompt", gt=0)
    temperature: float = option(0.0, "sampling temperature of the evaluation; 0 is greedy", ge=0.0)
    top_p: float = option(1.0, "nucleus sampling of the evaluation", gt=0.0, le=1.0)
    top_k: int = option(-1, "top-k sampling of the evaluation; -1 disables", ge=1, also_allowed=(-1,))
    pass_k: list[int] = option(
        [], "k of each pass@k reported (val/pass@k, per data_source too), estimated without bias from the n samples "
            "of a prompt (each k <= n); empty = [n] when n > 1", gt=0)
    solved_score: float = option(1.0, "a sample solves its prompt when its score is at least this (pass@k)")
    replicas: int = option(1, "evaluator actors; an evaluation's prompts are split among them", gt=0)
    num_cpus_per_replica: float = option(0.1, "CPUs Ray reserves for each evaluator actor (a fraction on CPU)",
                                         gt=0.0)
    num_gpus_per_replica: float = option(
        0.0, "GPU share of each evaluator actor: 1 = a device of its own, a fraction to share one the trainer and "
             "rollout pools do not hold; 0 runs it on CPU", ge=0.0, le=1.0)
    timeout_s: float = option(
        600.0, "limit on one evaluation; one past it is dropped, counted in val/num_timeouts, and the actors "
               "restarted", gt=0.0, le=MAX_WAIT_S)
