"""Extreme metrics (the rollout correction's `is_max` / `is_min` in the trainer's bypass mode) are the largest
and smallest values over micro-batches and ranks, never token-weighted means of per-micro-batch extremes."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
import torch.distributed as dist

from asyncrl.bench.trainer_ranks import free_port
from asyncrl.train.metric_sums import MetricSums
from asyncrl.algos import compute_bypass_correction
from asyncrl.train.policy_loss import EXTREME_METRICS, LossMetrics


def micro_metrics(is_max: float, is_min: float, tokens: int, clipfrac: float) -> LossMetrics:
    return LossMetrics({}, {"rollout_corr/is_max": torch.tensor(is_max),
                            "rollout_corr/is_min": torch.tensor(is_min),
                            "pg_clipfrac": torch.tensor(clipfrac)}, torch.tensor(float(tokens)))


def test_extremes_over_micro_batches_and_a_mean_beside_them():
    sums = MetricSums()
    micro_metrics(3.0, 0.5, 4, 0.25).record(sums)
    micro_metrics(2.0, 0.2, 100, 0.0).record(sums)
    micro_metrics(0.0, 0.0, 0, 0.0).record(sums)  # no valid token: its zeros must win neither extreme
    metrics = sums.finish(num_steps=1)
    # Token-weighted means would give 2.04 and 0.21; the extremes are 3.0 and 0.2.
    assert metrics["rollout_corr/is_max"] == pytest.approx(3.0)
    assert metrics["rollout_corr/is_min"] == pytest.approx(0.2)
    assert metrics["pg_clipfrac"] == pytest.approx(0.25 * 4 / 104)


def test_nothing_measured_reports_zero_not_infinity():
    sums = MetricSums()
    micro_metrics(0.0, 0.0, 0, 0.0).record(sums)
    metrics = sums.finish(num_steps=1)
    assert (metrics["rollout_corr/is_max"], metrics["rollout_corr/is_min"]) == (0.0, 0.0)


def _rank(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        sums = MetricSums()
        if rank == 0:
            micro_metrics(1.5, 0.9, 10, 0.1).record(sums)
        else:
            micro_metrics(4.0, 0.6, 2, 0.0).record(sums)
            micro_metrics(0.0, 0.0, 0, 0.0).record(sums)
        results.put((rank, sums.finish(num_steps=1)))
    finally:
        dist.destroy_process_group()


def test_extremes_over_ranks_of_a_gloo_group():
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_rank, args=(rank, port, results)) for rank in range(2)]
    for process in processes:
        process.start()
    gathered = dict(results.get(timeout=60) for _ in processes)
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    for rank in range(2):  # every rank reports the global values
        assert gathered[rank]["rollout_corr/is_max"] == pytest.approx(4.0)
        assert gathered[rank]["rollout_corr/is_min"] == pytest.approx(0.6)
        assert gathered[rank]["pg_clipfrac"] == pytest.approx(0.1 * 10 / 12)


def test_the_extremes_are_named_as_the_bypass_correction_names_them():
    """The loss looks the extremes up by the names the correction returns: a renamed metric would silently
    fall back to a token-weighted mean."""
    log_probs, rollout = torch.randn(2, 5), torch.randn(2, 5)
    _, _, metrics = compute_bypass_correction(log_probs, rollout, torch.ones(2, 5), is_level="token")
    assert set(EXTREME_METRICS) <= set(metrics)
