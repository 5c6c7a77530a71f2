"""Evaluation as its own stage (`evaluation.*`): every `freq` policy versions the trainer's weights go to evaluator
actors of their own (`rollout/evaluator.py`), which generate the evaluation prompts with that version pinned while
training goes on; the driver scores the results when they are back and logs them under the version they measured.

    stage = EvaluationStage.launch(config, dataset, scorer, tokenizer, trainers)   # the composition root
    stage.maybe_start(version, step)   # after a step: dispatches when a version is due and none is in flight
    rows = stage.poll()                # finished evaluations, scored: (step, metrics) each, never blocks
    rows = stage.finish(version, step) # the end of the run: the last version evaluated, every one collected
    stage.summary()                    # the best and the last, for summary.json

Dispatching costs the trainer one gather of its weights (`timing_s/evaluation_dispatch`); the generation runs on
the evaluators' own devices (or CPU shares), so neither the rollout replicas nor the weight syncs wait for it.
One evaluation runs at a time: a version that comes due while one runs is evaluated once it is back (then the
newest weights go, labelled with the version they carry). An evaluation past `evaluation.timeout_s` is dropped,
counted (`val/num_timeouts`) and its actors are restarted.

Metrics are `trainer.test_freq`'s validation keys (`core/validation.py`: val/score/mean, per data_source, pass@k),
in a row of their own with `val/param_version` (the version measured), `val/started_step` and `val/finished_step`
(the row's `step`: the step after which it came back), and `val/off_version_tokens` (0: every token was sampled
by the version measured).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

import ray

from asyncrl.config import AsyncRLConfig
from asyncrl.core.records import Sample
from asyncrl.core.requests import make_requests
from asyncrl.core.scoring import score_samples
from asyncrl.core.trainer_group import TrainerGroup
from asyncrl.core.validation import validation_metrics
from asyncrl.data.dataset import PromptDataset
from asyncrl.engine import SamplingParams
from asyncrl.remote import RemoteCallError, RemoteTimeoutError, contiguous_shares, wait_for, worker_name
from asyncrl.rewards import Scorer
from asyncrl.rollout.evaluator import EvaluatorActor

logger = logging.getLogger(__name__)


@dataclass
class EvaluationRun:
    """One dispatched evaluation: the version measured, the step after which it started, the evaluators' refs
    (actor i's share of the requests, (begin, end), at index i) and its deadline."""
    version: int
    step: int
    refs: list[ray.ObjectRef]
    shares: list[tuple[int, int]]
    deadline: float
    dispatch_s: float = 0.0   # the trainer's time spent dispatching it (gathering its weights)


class EvaluationStage:
    POOL_NAME = "evaluator"

    def __init__(self, config: AsyncRLConfig, dataset: PromptDataset, scorer: Scorer, tokenizer: Any,
                 trainers: TrainerGroup, actors: list):
        self.config = config
        self.settings = config.evaluation
        self.dataset = dataset
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.trainers = trainers
        self.actors = actors
        self.names = [worker_name(self.POOL_NAME, index) for index in range(len(actors))]
        self.running: Optional[EvaluationRun] = None
        self.last_started: Optional[int] = None   # the version last dispatched
        self.history: list[dict[str, float]] = []
        self.num_timeouts = 0

    @staticmethod
    def launch_actors(config: AsyncRLConfig) -> list:
        """The evaluator actors, started without waiting for them (they build their engines while the run starts)."""
        settings = config.evaluation
        device = "cuda" if settings.num_gpus_per_replica > 0 else "cpu"
        threads = max(1, int(settings.num_cpus_per_replica))
        return [EvaluatorActor.options(num_cpus=settings.num_cpus_per_replica, num_gpus=settings.num_gpus_per_replica,
                                       max_restarts=-1, max_task_retries=0).remote(config, device, threads)
                for _ in range(settings.replicas)]

    # ---- dispatch and collection ----------------------------------------------------------------------
    def is_due(self, version: int) -> bool:
        return self.last_started is None or version >= self.last_started + self.settings.freq

    def maybe_start(self, version: int, step: int, metrics: dict[str, float]) -> None:
        """Dispatch an evaluation of the trainer's weights (which carry `version`) when one is due and none runs."""
        if self.running is not None or not self.is_due(version):
            return
        started = time.monotonic()
        weights = self.trainers.policy_state()
        settings = self.settings
        params = SamplingParams(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                                max_new_tokens=self.config.data.max_response_length)
        requests = make_requests(self.dataset.prompts, settings.n, params, self.config.rollout.seed, "eval")
        shares = contiguous_shares(len(requests), len(self.actors))
        weights_ref = ray.put(weights)   # one copy in the object store, shared by the actors
        refs = [self.actors[index].evaluate.remote(version, weights_ref, requests[begin:end])
                for index, (begin, end) in enumerate(shares)]
        dispatch_s = time.monotonic() - started
        self.running = EvaluationRun(version, step, refs, shares, time.monotonic() + settings.timeout_s, dispatch_s)
        self.last_started = version
        metrics["timing_s/evaluation_dispatch"] = dispatch_s

    def poll(self, step: int) -> list[dict[str, float]]:
        """The evaluation that came back (scored), or none; never waits."""
        if self.running is None:
            return []
        ready, _ = ray.wait(self.running.refs, num_returns=len(self.running.refs), timeout=0)
        if len(ready) < len(self.running.refs) and time.monotonic() < self.running.deadline:
            return []
        return self.collect(step)

    def collect(self, step: int) -> list[dict[str, float]]:
        """Wait for the running evaluation (until its deadline) and score it."""
        started = time.monotonic()
        run, self.running = self.running, None
        try:
            outputs = [wait_for(ref, self.names[index], "evaluate", max(0.0, run.deadline - time.monotonic()))
                       for index, ref in enumerate(run.refs)]
        except RemoteTimeoutError as error:
            self.num_timeouts += 1
            logger.warning("evaluation of version %d dropped (val/num_timeouts): %s", run.version, error)
            for actor in self.actors:
                ray.kill(actor, no_restart=False)   # a restarted actor takes the next evaluation at once
            return []
        except RemoteCallError as error:
            raise RemoteCallError(f"evaluation of version {run.version}: {error}") from None
        results = [result for share, _ in outputs for result in share]
        row = self.score(results, run, step)
        # What the evaluation cost the training loop (dispatch, then collection and scoring on the driver), next
        # to how long the evaluators generated.
        row["val/trainer_blocked_s"] = run.dispatch_s + time.monotonic() - started
        row["val/generation_s"] = max(seconds for _, seconds in outputs)
        self.history.append(row)
        return [row]

    def score(self, results: list, run: EvaluationRun, step: int) -> dict[str, float]:
        num_samples = self.settings.n
        samples = [Sample(self.dataset.prompts[index // num_samples], index // num_samples, index % num_samples, result)
                   for index, result in enumerate(results)]
        scored, _ = score_samples(samples, self.scorer, self.tokenizer)
        metrics = validation_metrics(scored, num_samples, self.settings.solved_score, self.settings.pass_k or None)
        off_version = sum(int((result.response_versions != run.version).sum()) for result in results)
        return {**metrics, "val/param_version": float(run.version), "val/started_step": float(run.step),
                "val/finished_step": float(step), "val/off_version_tokens": float(off_version),
                "val/num_timeouts": float(self.num_timeouts)}

    def finish(self, version: int, step: int) -> list[dict[str, float]]:
        """At the end of the run: the running evaluation collected, then the last version evaluated (unless it
        was), waiting for both."""
        rows = self.collect(step) if self.running is not None else []
        if self.last_started != version:
            self.last_started = None   # due whatever the frequency: the last version is always measured
            self.maybe_start(version, step, {})
            rows += self.collect(step)
        return rows

    def summary(self) -> dict[str, Any]:
        """summary.json's `evaluation`: the best (by val/score/mean) and the last evaluation, and how many ran."""
        if not self.history:
            return {"num_evaluations": 0, "num_timeouts": self.num_timeouts}
        best = max(self.history, key=lambda row: row["val/score/mean"])
        return {"num_evaluations": len(self.history), "num_timeouts": self.num_timeouts, "best": best,
                "last": self.history[-1]}
