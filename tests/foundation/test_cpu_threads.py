"""The CPU thread policy of a run (asyncrl/launch/cpu_threads.py): OpenMP threads sleep at barriers in every
process the run starts unless the user chose otherwise, the driver runs one thread, and the computing workers
split the cores. A run's log states each worker's threads (checked on the README's runs, tests/docs)."""

import os

import torch

from asyncrl.launch.cpu_threads import cpu_policy, threads_per_worker, worker_environment
from asyncrl.launch.resource_pool import PoolSpec
from asyncrl.rewards.executor import available_cpus


def test_the_run_sets_passive_waits_and_one_driver_thread_then_restores_both(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    threads = torch.get_num_threads()
    with cpu_policy():
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and torch.get_num_threads() == 1
        assert worker_environment() == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert "OMP_WAIT_POLICY" not in os.environ and torch.get_num_threads() == threads


def test_a_users_own_wait_policy_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    with cpu_policy():
        assert worker_environment() == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_cpu_workers_split_the_cores_and_a_gpu_workers_host_runs_one_thread():
    cores = available_cpus()
    cpu = PoolSpec("trainer", 1, 0.0, 0.45)
    assert threads_per_worker(cpu, 1) == cores
    assert threads_per_worker(cpu, 2) * 2 <= max(cores, 2)        # never more threads than cores (one at least)
    assert threads_per_worker(cpu, 4 * cores) == 1
    assert threads_per_worker(PoolSpec("trainer", 8, 1.0, 1.0), 8) == 1
