"""The fully-async rollouter: a Ray asyncio actor that owns the data cursor and streams scored groups.

It admits one prompt at a time (a group of rollout.n requests, sent to one replica in one call so the
responses share the prompt's KV blocks) while the staleness budget, the concurrency cap and the queue
allow, scores each group as soon as its last response arrives, and puts it on the queue. Groups that
finish while an earlier batch is being scored are scored and queued together (one reward call and one
queue call per batch, not per group). It never drops a finished sample, except the groups dynamic sampling
filters (`algorithm.filter_groups`): a group whose rewards do not vary never reaches the queue, and its prompt
leaves the staleness budget, so admission goes on until the trainer has its groups (see `budget.py`).

Scoring is the training reward of every mode (`core.training_reward`): the reward function's score, DAPO's
overlong penalty, and, for an estimator that needs one (remax), the reward of the prompt's greedy response,
which is generated in the same call as the group (one more slot, `Group.greedy_slot`) and never trained on.

It owns the run's rollout backend (`RolloutHost`: the composition root builds the replica set here), so one
object holds the replicas, their health, the failover of a dead replica's requests and the weight sync; the
driver's validation and sync reach it through this actor. It receives what the composition root built (the
tokenizer and the training data; the data cursor arrives with `run`) and starts its own scoring processes
from the reward settings, since processes cannot travel between actors.

At a weight sync the trainer calls `pause` (admission stops; without partial rollout the in-flight groups
finish, with partial rollout their requests are aborted and the partial responses kept), then
`resume(version)`, after which parked groups continue from their partial responses with the remaining
token budget (only the unfinished responses of a group are resumed). While paused, `snapshot` returns
everything a lossless checkpoint needs: the data cursor, the parked groups and the scored groups not
yet on the queue.

A group and the requests of its slots are in `group.py`. With an agent (rollout.multi_turn, or your own with
rollout.agent.path) each slot is a trajectory or an agent run instead of one response: `agent_slots.py` advances
them, through this same loop.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any, Optional

import ray

from asyncrl.config import AsyncRLConfig
from asyncrl.core.distillation import with_teacher_scores
from asyncrl.core.dynamic_sampling import DynamicSamplingError, FilterWindow, has_signal
from asyncrl.core.records import Sample
from asyncrl.core.training_reward import score_for_training
from asyncrl.data.dataset import PromptDataset
from asyncrl.data.sampler import PromptSampler
from asyncrl.engine import GenerationRequest, GenerationResult
from asyncrl.recipes.fully_async.agent_slots import AgentRunSlots, TrajectorySlots
from asyncrl.recipes.fully_async.budget import StalenessBudget
from asyncrl.recipes.fully_async.group import Group, SlotRequests
from asyncrl.recipes.fully_async.queue import SampleQueue
from asyncrl.rewards import RewardExecutor, RewardModelPool, Scorer
from asyncrl.rollout import RolloutHost
from asyncrl.teacher import TeacherPool


class Rollouter(RolloutHost):
    def __init__(self, config: AsyncRLConfig, tokenizer: Any, dataset: PromptDataset,
                 reward_models: Optional[RewardModelPool] = None, teacher: Optional[TeacherPool] = None):
        self.config = config
        self.version = 0
        self.tokenizer = tokenizer
        self.dataset = dataset
        self.sampler = PromptSampler(len(dataset), config.data.shuffle, config.data.seed, config.trainer.total_epochs)
        # Scoring processes cannot travel between actors: the rollouter starts its own from the same settings;
        # the reward-model actors (reward.model) are the run's, handed over by the composition root.
        self.reward = Scorer(RewardExecutor.from_config(config.reward), reward_models, config.reward.model)
        self.teacher = teacher   # algorithm.distillation: groups are queued with the teacher's log-probs
        self.budget = StalenessBudget.from_config(config)
        self.queue = SampleQueue(capacity=self.budget.max_per_version)
        self.requests = SlotRequests.from_config(config)
        self.counters = {"generated_groups": 0, "resumed_responses": 0, "aborted_responses": 0,
                         "queued_groups": 0, "filtered_groups": 0}
        # The agent paths (agent_slots.py), at most one: each slot of a group is a trajectory of turns and tool
        # calls (rollout.multi_turn), or one run of your own agent against this actor's recording endpoint
        # (rollout.agent.path).
        self.trajectories = TrajectorySlots.from_config(config, tokenizer, self.requests, self.counters)
        self.agent_runs = AgentRunSlots.from_config(config, tokenizer, self.requests)
        self.in_flight: dict[int, Group] = {}      # admitted, generating (or parked after an abort)
        self.unqueued: dict[int, Group] = {}       # generated, being scored and put on the queue
        self.next_serial = 0
        self.is_paused = False
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.settled = asyncio.Condition()
        self.delivering = asyncio.Lock()            # one scoring + queue call at a time
        self.to_deliver: list[Group] = []           # generated, waiting for the next delivery
        self.waiting_takes: set[asyncio.Future] = set()   # the trainer's takes waiting for groups
        self.filtering = FilterWindow.from_config(config)
        self.failure: Optional[Exception] = None     # raised to the trainer by its next take
        self.filter_counts_at_sync = (0, 0)           # queued and filtered groups at the last sync
        self.admitted_in_version = 0                # prompts admitted under this version's budget since its sync
        self.max_in_flight = 0                      # groups generating at once, set when the rollout is known
        self.num_replicas = 0                       # rollout workers during the current version
        self.groups_at_sync = 0                     # generated groups counted at the last sync

    # ---- the feed -----------------------------------------------------------------------------------
    async def run(self, version: int, state: dict[str, Any], queued: list[list[Sample]]) -> dict[str, float]:
        """From `state` (the data cursor and parked groups of a checkpoint, or the driver's cursor on a fresh
        run) and the groups that were queued: admit prompts until the data is used up, let every group
        finish, then end the stream."""
        self.version = version
        self.size_to_workers()
        self.sampler.load_state_dict(state["sampler"])
        parked = list(state["parked"])
        self.next_serial = state["next_serial"]
        await self.queue.restore(queued)
        self.budget.charged = len(parked) + len(queued)
        self.rollout.activity().restart()
        if self.agent_runs is not None:
            await self.agent_runs.start(self.rollout, lambda: self.version)
        tasks = [asyncio.create_task(self.run_group(group)) for group in parked]
        while True:
            await self.wait_for_admission()
            index = self.sampler.next_index()
            if index is None:
                break
            group = self.new_group(index)
            self.next_serial += 1
            self.budget.admit()
            self.admitted_in_version += 1
            tasks.append(asyncio.create_task(self.run_group(group)))
        await asyncio.gather(*tasks)
        if self.agent_runs is not None:
            await self.agent_runs.stop()
        await self.queue.close()
        return {**self.counters, **self.rollout.health().metrics()}

    def size_to_workers(self) -> None:
        """The concurrency cap follows the number of rollout workers, which a sync may change (asyncrl scale, a
        retired replica)."""
        self.num_replicas = self.rollout.health().num_workers
        self.max_in_flight = self.config.async_training.max_concurrent_samples or \
            min(16 * self.num_replicas, self.budget.max_per_version)

    def throughput_metrics(self, version_s: float) -> dict[str, float]:
        """Samples generated in the version that ends now per second of each replica it had: comparable across
        versions run with different numbers of replicas."""
        groups = self.counters["generated_groups"] - self.groups_at_sync
        self.groups_at_sync = self.counters["generated_groups"]
        samples = groups * self.config.rollout.n
        return {"rollout/num_replicas_in_version": float(self.num_replicas),
                "rollout/samples_per_replica_s": samples / max(version_s * self.num_replicas, 1e-9)}

    def new_group(self, index: int) -> Group:
        """An admitted prompt's group: rollout.n slots, and one more for the greedy baseline when needed."""
        num_samples = self.config.rollout.n
        num_slots = num_samples + (self.requests.greedy_params is not None)
        return Group(self.dataset[index], self.sampler.epoch, self.next_serial, [None] * num_slots,
                     num_samples=num_samples)

    async def wait_for_admission(self) -> None:
        async with self.settled:
            await self.settled.wait_for(lambda: not self.is_paused and self.budget.can_admit()
                                        and len(self.in_flight) < self.max_in_flight)

    async def run_group(self, group: Group) -> None:
        self.in_flight[group.serial] = group
        while not group.is_generated:
            await self.resumed.wait()
            pending = [slot for slot, result in enumerate(group.results)
                       if result is None or result.finish_reason == "abort"]
            outputs = await self.generate_slots(group, pending)
            for slot, result in zip(pending, outputs):
                group.results[slot] = result
                self.counters["aborted_responses"] += result.finish_reason == "abort"
        self.unqueued[group.serial] = group
        del self.in_flight[group.serial]
        self.counters["generated_groups"] += 1
        async with self.settled:
            self.settled.notify_all()  # its slot is free: the next prompt is admitted while this one is scored
        await self.deliver(group)

    async def deliver(self, group: Group) -> None:
        """Score `group` and put it on the queue, with every group that finished while the previous
        delivery ran. Returns once `group` is on the queue: whoever holds the lock first takes the whole
        batch, and a later caller whose group was taken finds the batch empty."""
        self.to_deliver.append(group)
        async with self.delivering:  # the reward executor's worker pipes are not shared between calls
            batch, self.to_deliver = self.to_deliver, []
            if not batch:
                return
            await self.score(batch)
            kept = self.filter_groups(batch)
            if self.teacher is not None:   # the groups that will train, scored while generation goes on
                await self.score_with_teacher(kept)
            await self.queue.put_many([member.scored for member in kept])
            self.counters["queued_groups"] += len(kept)
            for member in batch:
                del self.unqueued[member.serial]
        async with self.settled:
            self.settled.notify_all()  # a pause waits until finished groups are on the queue

    async def score(self, batch: list[Group]) -> None:
        """Score the groups' samples (and greedy baselines) in one call; each group keeps its scored samples."""
        samples = [member.samples() for member in batch]
        flat = [sample for group in samples for sample in group]
        if self.agent_runs is not None:   # scored by the agent's own reward
            scored = self.agent_runs.score(flat, self.config)
        else:
            scored, _ = await asyncio.to_thread(score_for_training, flat, self.reward, self.tokenizer, self.config)
        start = 0
        for member, group in zip(batch, samples):
            member.scored, start = scored[start:start + len(group)], start + len(group)

    async def score_with_teacher(self, batch: list[Group]) -> None:
        """The teacher's log-probs for the groups' samples, in one call to its actors (in a worker thread)."""
        flat = [sample for member in batch for sample in member.scored]
        scored = await asyncio.to_thread(with_teacher_scores, flat, self.teacher)
        start = 0
        for member in batch:
            member.scored, start = scored[start:start + len(member.scored)], start + len(member.scored)

    def filter_groups(self, batch: list[Group]) -> list[Group]:
        """The groups that go on the queue: all of them, or with dynamic sampling those whose rewards vary. A
        filtered group's prompt is released from the staleness budget: it will never be trained, so it holds no
        place among the groups the bound is about, and admission continues until the trainer has its groups."""
        if not self.filtering.enabled:
            return batch
        kept = []
        for member in batch:
            is_kept = has_signal(member.scored, self.filtering.metric)
            if is_kept:
                kept.append(member)
            else:
                self.counters["filtered_groups"] += 1
                self.budget.release()
            try:
                self.filtering.count(is_kept)
            except DynamicSamplingError as error:
                self.failure = self.failure or error   # the trainer's next take raises it
        return kept

    def version_filter_metrics(self) -> dict[str, float]:
        """`filter/*` over the groups scored since the last sync (with dynamic sampling), then a new count."""
        queued, filtered = self.counters["queued_groups"], self.counters["filtered_groups"]
        last_queued, last_filtered = self.filter_counts_at_sync
        self.filter_counts_at_sync = (queued, filtered)
        if not self.filtering.enabled:
            return {}
        generated = queued - last_queued + filtered - last_filtered
        return {"filter/num_generated_groups": float(generated),
                "filter/num_filtered_groups": float(filtered - last_filtered),
                "filter/kept_ratio": (queued - last_queued) / max(generated, 1)}

    async def generate_slots(self, group: Group, slots: list[int]) -> list[GenerationResult]:
        """Generate (or resume) the responses of `slots` in one call, so they share the prompt's KV blocks on
        one engine; the rollout chooses the engine and starts the requests again elsewhere if it dies."""
        if self.trajectories is not None:
            return await self.trajectories.generate(self.rollout, group, slots)
        if self.agent_runs is not None:
            return await self.agent_runs.generate(group, slots)
        requests = []
        for slot in slots:
            previous = group.results[slot]
            if slot == group.greedy_slot:
                requests.append(self.requests.greedy(group))
            elif previous is None:
                requests.append(self.requests.sampled(group, slot))
            else:
                requests.append(GenerationRequest.resume(previous, self.requests.sampled_params(group, slot)))
            self.counters["resumed_responses"] += previous is not None
        return await self.rollout.generate(requests)

    # ---- the sync protocol --------------------------------------------------------------------------
    async def pause(self) -> dict[str, float]:
        """Stop admitting and let generation settle: without partial rollout the in-flight groups finish;
        with it, their requests are aborted (partial responses kept). Returns when nothing generates."""
        started = time.monotonic()
        self.is_paused = True
        self.resumed.clear()
        for waiting in self.waiting_takes:
            waiting.cancel()
        await self.rollout.pause()   # no request starts, nor starts again after its replica died
        if self.config.async_training.partial_rollout:
            await self.rollout.abort()
        await self.rollout.wait_until_idle()
        async with self.settled:
            await self.settled.wait_for(self.is_settled)
        return {"timing_s/rollouter_pause": time.monotonic() - started}

    def is_settled(self) -> bool:
        """Every fully generated group is on the queue (nothing generates once the paused rollout is idle);
        groups left in flight are parked (aborted responses, or responses waiting for a replica to come back)."""
        return not self.unqueued and not any(group.is_generated for group in self.in_flight.values())

    async def resume(self, version: int, held: int) -> tuple[dict[str, float], list[tuple[float, float]]]:
        """A new version: charge outstanding work (generating, parked, queued, and the `held` groups the
        trainer took ahead but has not trained) to its budget and let parked groups continue. Returns the last
        version's idle ratio and admitted prompts, the work charged to the new one, the rollouter's counters, and
        the wall-clock spans during which something generated (for the timeline): one call per sync."""
        queue_size = await self.queue.size()
        activity = self.rollout.activity()
        idle_s, version_s = activity.lap()
        metrics = {"rollouter/idle_ratio": min(1.0, idle_s / version_s), "rollouter/version_time": version_s,
                   "fully_async/rollouter/admitted_in_version": float(self.admitted_in_version),
                   **self.throughput_metrics(version_s)}
        self.version = version
        self.size_to_workers()
        outstanding = len(self.in_flight) + len(self.unqueued) + queue_size + held
        self.budget.on_sync(outstanding)
        self.admitted_in_version = 0
        metrics["fully_async/rollouter/outstanding_at_sync"] = float(outstanding)
        metrics |= self.version_filter_metrics()
        self.is_paused = False
        await self.rollout.resume()   # the sync brought restarted replicas back into rotation
        self.resumed.set()
        async with self.settled:
            self.settled.notify_all()
        return {**metrics, **await self.stats()}, activity.take_spans()

    async def take(self, count: int, timeout_s: float) -> Optional[list[list[Sample]]]:
        """For the trainer: `count` scored groups, oldest first (see `SampleQueue.get`); [] when a pause
        comes first (the trainer's sync must not race a transfer of samples)."""
        if self.failure is not None:
            raise self.failure
        if self.is_paused:
            return []
        waiting = asyncio.ensure_future(self.queue.get(count, timeout_s))
        self.waiting_takes.add(waiting)
        try:
            return await waiting
        except asyncio.CancelledError:
            if not waiting.cancelled():
                raise  # this call itself was cancelled, not the wait
            return []
        finally:
            self.waiting_takes.discard(waiting)

    async def cursor(self) -> dict[str, int]:
        return self.sampler.state_dict()

    async def snapshot(self) -> dict[str, Any]:
        """Everything a checkpoint needs from the rollouter (call while paused): its own state, and the
        queued groups, kept apart as checkpoints store them."""
        if not self.is_paused:
            raise RuntimeError("rollouter snapshot taken while generating; pause first")
        # A copy: trajectories whose tools still run go on appending to the live groups.
        return {"rollouter": {"sampler": self.sampler.state_dict(),
                              "parked": copy.deepcopy(list(self.in_flight.values())),
                              "next_serial": self.next_serial},
                "queue": await self.queue.snapshot()}

    async def final_report(self) -> dict[str, float]:
        """At the end of the run (paused): the counters and `filter/*` of the last version, for its record."""
        return {**await self.stats(), **self.version_filter_metrics()}

    async def states(self) -> dict[str, dict[str, float]]:
        """The queue's and the rollouter's state, apart (for the watchdog's report)."""
        stats = await self.stats()
        return {"queue": {name: value for name, value in stats.items() if name.startswith("fully_async/queue/")},
                "rollouter": {name: value for name, value in stats.items()
                              if not name.startswith("fully_async/queue/")}}

    async def stats(self) -> dict[str, float]:
        health = self.rollout.health()
        counters = {**self.counters, "replica_failures": health.num_failures,
                    "requeued_requests": health.num_requeued_requests}
        return {**await self.queue.stats(), "fully_async/rollouter/in_flight": float(len(self.in_flight)),
                "fully_async/rollouter/budget_charged": float(self.budget.charged),
                "fully_async/rollouter/budget_per_version": float(self.budget.max_per_version),
                **{f"fully_async/count/{name}": float(value) for name, value in counters.items()},
                **health.metrics(), **self.reward.metrics(),
                **(self.agent_runs.metrics() if self.agent_runs is not None else {})}


# Every blocking ray.get of this actor runs in a worker thread (asyncio.to_thread: building the replica set, the
# weight syncs, the driver's batch generations), never on its event loop. Ray warns about any ray.get in an
# asyncio actor's process, which cannot tell the two apart, so that warning is off for this actor alone.
RolloutActor = ray.remote(runtime_env={"env_vars": {"RAY_WARN_BLOCKING_GET_INSIDE_ASYNC": "0"}})(Rollouter)
