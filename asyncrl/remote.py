"""Every wait on another actor goes through `wait_for`, so none can hang and every failure is named.

    metrics = wait_for(worker.update_actor.remote(batch), component="trainer/rank0", call="update_actor",
                       timeout_s=600)

A wait past its limit raises `RemoteTimeoutError`; a dead actor or a remote exception raises
`RemoteCallError`; both name the component (`worker_name`: trainer/rank0, rollout/replica1, ...), the call
and the elapsed time. This module sits at the ground of the package, so every room that talks to an actor
(rollout, core, launch) waits the same way.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError


def worker_name(pool_name: str, index: int) -> str:
    """How errors, logs and `summary.json` name a worker: trainer/rank0, rollout/replica1."""
    return f"trainer/rank{index}" if pool_name == "trainer" else f"{pool_name}/replica{index}"


def contiguous_shares(num_rows: int, num_actors: int) -> list[tuple[int, int]]:
    """(begin, end) of each actor's share: as equal as can be, in order, none empty (fewer shares than actors
    when there are fewer rows)."""
    num_shares = min(num_actors, num_rows)
    bounds = [num_rows * index // num_shares for index in range(num_shares + 1)] if num_shares else [0]
    return list(zip(bounds[:-1], bounds[1:]))


class RemoteCallError(RuntimeError):
    """A remote call failed (the actor died or raised); the message names it."""


class RemoteUnavailableError(RemoteCallError):
    """The actor is down for now (Ray is restarting it); a later call may succeed."""


class RemoteTimeoutError(TimeoutError):
    """A remote call did not answer in time; the message names it."""


def wait_for(ref: ray.ObjectRef, component: str, call: str, timeout_s: float) -> Any:
    return wait_for_all([ref], [component], call, timeout_s)[0]


def wait_for_all(refs: Sequence[ray.ObjectRef], components: Sequence[str], call: str, timeout_s: float) -> list:
    """Results in order; the first failure raises, naming its component (the slowest one on timeout)."""
    started = time.monotonic()
    pending = dict(zip(refs, components))
    results: dict[ray.ObjectRef, Any] = {}
    while pending:
        remaining = timeout_s - (time.monotonic() - started)
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, remaining))
        if not ready:
            names = ", ".join(pending.values())
            raise RemoteTimeoutError(f"{names}: {call} did not answer within {timeout_s:.0f}s "
                                     f"(waited {time.monotonic() - started:.1f}s)")
        for ref in ready:
            component = pending.pop(ref)
            results[ref] = fetch(ref, component, call, started)
    return [results[ref] for ref in refs]


def collect_shares(refs: Sequence[ray.ObjectRef], shares: Sequence[tuple[int, int]], actors: Sequence[Any],
                   names: Sequence[str], call: str, deadline: float, failed: Callable[[bool, str], Any]) -> list:
    """The results of a call split among actors (actor i answered rows shares[i] = (begin, end) with a list), in row
    order. A share past `deadline` (time.monotonic()) gives `failed(True, message)` for each of its rows and its
    actor is restarted (the call may run on for long: a restarted actor takes the next one at once); a share whose
    actor raised or died gives `failed(False, message)` for each."""
    results: list = []
    for index, (ref, (begin, end)) in enumerate(zip(refs, shares)):
        try:
            results.extend(wait_for(ref, names[index], call, max(0.0, deadline - time.monotonic())))
        except RemoteTimeoutError as error:
            ray.kill(actors[index], no_restart=False)
            results.extend([failed(True, str(error))] * (end - begin))
        except RemoteCallError as error:
            results.extend([failed(False, str(error))] * (end - begin))
    return results


STILL_RUNNING = "still running"


def settle(refs: Sequence[ray.ObjectRef], components: Sequence[str], timeout_s: float) -> dict[str, str]:
    """Wait (up to `timeout_s`) for calls whose siblings failed, so a retry does not queue behind them;
    returns each component's outcome ("ok", the error, or `STILL_RUNNING`)."""
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    outcomes = {}
    for ref, component in zip(refs, components):
        if ref not in ready:
            outcomes[component] = STILL_RUNNING
            continue
        try:
            ray.get(ref, timeout=0)
            outcomes[component] = "ok"
        except Exception as error:  # the outcome is reported, not raised: the caller already has the failure
            outcomes[component] = f"{type(error).__name__}: {str(error)[-600:]}"
    return outcomes


def fetch(ref: ray.ObjectRef, component: str, call: str, started: float) -> Any:
    elapsed = time.monotonic() - started
    try:
        return ray.get(ref, timeout=0)
    except ActorUnavailableError as error:
        raise RemoteUnavailableError(f"{component} died during {call} after {elapsed:.1f}s (unavailable; Ray "
                                     f"may be restarting it): {error}") from None
    except RayActorError as error:
        if "restarting" in str(error):
            raise RemoteUnavailableError(f"{component} died during {call} after {elapsed:.1f}s (Ray is "
                                         f"restarting it): {error}") from None
        raise RemoteCallError(f"{component} died during {call} after {elapsed:.1f}s: {error}") from None
    except RayTaskError as error:
        cause = error.cause if isinstance(error.cause, BaseException) else error
        raise RemoteCallError(f"{component} failed in {call} after {elapsed:.1f}s: "
                              f"{type(cause).__name__}: {cause}") from error
    except GetTimeoutError:  # ray.wait said ready; a get that still times out is an internal Ray state
        raise RemoteTimeoutError(f"{component}: {call} result was not retrievable after {elapsed:.1f}s") from None
