"""The client of the reward-model actors: splits a batch among them, waits with a deadline, never fails a run.

    check_reward_model(config.reward.model)                 # before Ray: the folder, template (and its fit), parser
    pool = RewardModelPool.launch(config.reward.model)      # after Ray: the actors load while the run starts
    pool.wait_ready(timeout_s)                              # each actor loaded its model, or the error names it
    pending = pool.start(requests)                          # dispatched at once; the caller scores its rules
    results = pool.collect(pending)                         # one RewardResult per request, in order

A call's samples are split into contiguous shares, one per actor. A share whose actor is past
`reward.model.timeout_s` (counted from `start`) scores 0 as timeouts and the actor is restarted (Ray reloads
its model); one whose actor raised or died scores 0 as errors. Both are counted (`reward/model_timeouts`,
`reward/model_errors`), and the run goes on. The pool is plain data plus actor handles, so the composition
root hands it to the fully-async rollouter; each copy counts its own calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import ray

from asyncrl.config import ConfigError
from asyncrl.config.reward_schema import RewardModelConfig
from asyncrl.config.user_code import split_spec
from asyncrl.models import check_model_folder, load_tokenizer
from asyncrl.remote import collect_shares, contiguous_shares, wait_for_all, worker_name
from asyncrl.rewards.judge import ANSWER_PARSERS, check_template, check_template_fits
from asyncrl.rewards.protocol import Failure, RewardRequest, RewardResult
from asyncrl.rewards.reward_model_worker import RewardModelWorker

POOL_NAME = "reward_model"


def check_reward_model(config: RewardModelConfig) -> None:
    """The errors the actors would meet at load, raised before Ray starts (ConfigError naming the key): the
    folder (read from file headers only), its tokenizer, the judge's template and parser spec."""
    if not config.enable:
        return
    if not config.path:
        raise ConfigError("reward.model.path is empty; reward.model.enable=true needs the folder of the reward "
                          "model (kind=discriminative) or judge (kind=generative)")
    kind = "reward" if config.kind == "discriminative" else "causal_lm"
    try:
        model_config = check_model_folder(config.path, kind=kind)
        tokenizer = load_tokenizer(config.path)
        if config.kind == "generative":
            check_template(config.prompt_template)
            check_template_fits(tokenizer, config.prompt_template,
                                config.max_length or model_config.max_position_embeddings)
    except ValueError as error:
        raise ConfigError(f"reward.model (kind={config.kind}, path={config.path}): {error}") from None
    parser = config.answer_parser
    if config.kind == "generative" and parser not in ANSWER_PARSERS:
        spec = split_spec(parser)
        if spec is None:
            raise ConfigError(f"reward.model.answer_parser={parser!r} is neither a built-in parser "
                              f"{sorted(ANSWER_PARSERS)} nor 'path/to/file.py:function'")
        if spec.is_file and not Path(spec.location).is_file():
            raise ConfigError(f"reward.model.answer_parser={parser!r}: file {spec.location} does not exist")


@dataclass
class PendingScores:
    """A dispatched call: actor i's share of the requests (begin, end) and its result ref, at index i."""
    refs: list[ray.ObjectRef]
    shares: list[tuple[int, int]]
    deadline: float


@dataclass
class ModelCounters:
    """Cumulative over this copy of the pool's calls."""
    num_scored: int = 0
    num_errors: int = 0      # an actor raised or died, or (a judge) an answer the parser could not read
    num_timeouts: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {"reward/model_scored": self.num_scored, "reward/model_errors": self.num_errors,
                "reward/model_timeouts": self.num_timeouts}


class RewardModelPool:
    def __init__(self, actors: list, config: RewardModelConfig):
        self.actors = actors
        self.config = config
        self.names = [worker_name(POOL_NAME, index) for index in range(len(actors))]
        self.counters = ModelCounters()

    @classmethod
    def launch(cls, config: RewardModelConfig) -> RewardModelPool:
        """Starts `num_workers` actors without waiting for them; Ray restarts one that dies or is killed."""
        device = "cuda" if config.num_gpus_per_worker > 0 else "cpu"
        threads = max(1, int(config.num_cpus_per_worker))
        actors = [RewardModelWorker.options(num_cpus=config.num_cpus_per_worker, num_gpus=config.num_gpus_per_worker,
                                            max_restarts=-1, max_task_retries=0).remote(config, device, threads)
                  for _ in range(config.num_workers)]
        return cls(actors, config)

    def wait_ready(self, timeout_s: float) -> list[int]:
        """Each actor's process id once its model has loaded; a load failure raises RemoteCallError naming it."""
        return wait_for_all([actor.ping.remote() for actor in self.actors], self.names, "load", timeout_s)

    def start(self, requests: list[RewardRequest]) -> PendingScores:
        shares = contiguous_shares(len(requests), len(self.actors))
        refs = [self.actors[index].score.remote(requests[begin:end]) for index, (begin, end) in enumerate(shares)]
        return PendingScores(refs, shares, time.monotonic() + self.config.timeout_s)

    def collect(self, pending: PendingScores) -> list[RewardResult]:
        """The results in request order; a share past the deadline, or whose actor failed, scores 0."""
        results = collect_shares(pending.refs, pending.shares, self.actors, self.names, "score", pending.deadline,
                                 lambda timed_out, message: RewardResult.failed(
                                     Failure.TIMEOUT if timed_out else Failure.ERROR, message))
        self.counters.num_scored += len(results)
        self.counters.num_errors += sum(result.failure in (Failure.ERROR, Failure.NONFINITE) for result in results)
        self.counters.num_timeouts += sum(result.failure is Failure.TIMEOUT for result in results)
        return results

    def metrics(self) -> dict[str, float]:
        return self.counters.as_metrics()
