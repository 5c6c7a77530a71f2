"""How the processes of a run share a machine's cores (CPU runs; on GPU a worker's host runs one thread).

    with cpu_policy():                          # around a run, in the driver (`train`)
        threads = threads_per_worker(spec, n)   # each trainer rank's and rollout replica's torch threads

1. OpenMP threads sleep while they wait for each other (`OMP_WAIT_POLICY=PASSIVE`) in every process the run
   starts: the scoring processes and a local cluster's Ray workers inherit the driver's environment, a joined
   cluster's workers get it through the job's runtime environment (`worker_environment`). By default they spin,
   and a spinning thread holds a core that its partner, another process of the run, or a neighbour's process
   needs: on a 2-core machine beside other work, the long-tail demo's sync steps went from 0.3 s to 2-10 s
   (docs/troubleshooting.md). A setting of your own (`OMP_WAIT_POLICY=ACTIVE`) is kept.
2. The processes that compute, the trainer ranks and the rollout replicas, split the cores this process may
   use: each runs cores // workers torch threads, so together they never outnumber the cores. The driver, which
   coordinates, runs one thread during the run; the fully-async rollouter and reward-model actors run the one
   thread Ray gives an actor of a fractional CPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from asyncrl.launch.resource_pool import PoolSpec
from asyncrl.rewards.executor import available_cpus
from asyncrl.train.worker import GPU_HOST_THREADS

WAIT_POLICY_VARIABLE = "OMP_WAIT_POLICY"
WAIT_POLICY = "PASSIVE"
DRIVER_THREADS = 1


@contextlib.contextmanager
def cpu_policy() -> Iterator[None]:
    """The OpenMP wait policy in the environment of every process the run starts, and one torch thread in the
    driver; both as they were after the run."""
    previous_policy = os.environ.get(WAIT_POLICY_VARIABLE)
    previous_threads = torch.get_num_threads()
    os.environ.setdefault(WAIT_POLICY_VARIABLE, WAIT_POLICY)
    torch.set_num_threads(DRIVER_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(previous_threads)
        if previous_policy is None:
            os.environ.pop(WAIT_POLICY_VARIABLE, None)


def worker_environment() -> dict[str, str]:
    """What a joined cluster's workers of this run get in their environment."""
    return {WAIT_POLICY_VARIABLE: os.environ.get(WAIT_POLICY_VARIABLE, WAIT_POLICY)}


def threads_per_worker(spec: PoolSpec, num_workers: int) -> int:
    """A GPU worker's host needs one intra-op thread (`GPU_HOST_THREADS`); CPU workers split the cores."""
    return GPU_HOST_THREADS if spec.num_gpus_per_worker else max(1, available_cpus() // num_workers)
