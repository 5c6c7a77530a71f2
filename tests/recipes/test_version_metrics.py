"""Per-version records of fully_async against hand computations: the reference system's aggregation rules, and the
groups scored after the last sync completing the last record."""

import json

import pytest

from asyncrl.recipes.fully_async.metrics import VersionMetrics, aggregate


def test_aggregation_follows_the_rules_by_name():
    steps = [{"timing_s/gen": 1.0, "perf/time_per_step": 4.0, "perf/throughput": 100.0, "actor/pg_loss": 0.5,
              "staleness/max": 1.0, "response_length/min": 3.0, "fully_async/count/stale_samples_processed": 2.0,
              "param_version": 3.0},
             {"timing_s/gen": 3.0, "perf/time_per_step": 6.0, "perf/throughput": 50.0, "actor/pg_loss": -0.1,
              "staleness/max": 0.0, "response_length/min": 2.0, "fully_async/count/stale_samples_processed": 5.0,
              "param_version": 3.0}]
    record = aggregate(steps)
    assert record["timing_s/gen"] == 4.0 and record["perf/time_per_step"] == 10.0       # summed
    assert record["actor/pg_loss"] == pytest.approx(0.2)                                 # mean
    assert (record["staleness/max"], record["response_length/min"]) == (1.0, 2.0)
    assert record["fully_async/count/stale_samples_processed"] == 5.0                   # last
    assert record["perf/throughput"] == pytest.approx((100 * 4 + 50 * 6) / 10)          # tokens / seconds
    assert record["trainer/idle_ratio"] == pytest.approx(4 / 10)


def test_records_per_version_and_a_trailing_sync_completes_the_last(tmp_path):
    path = tmp_path / "metrics_by_version.jsonl"
    versions = VersionMetrics(path)
    assert versions.close(1, {"filter/num_generated_groups": 3.0}) is None  # nothing trained yet: nothing written
    for step in (1, 2):
        versions.add(step, {"param_version": 0.0, "timing_s/step": 1.0})
    versions.close(1, {"filter/num_generated_groups": 6.0, "filter/num_filtered_groups": 2.0,
                       "filter/kept_ratio": 4 / 6})
    versions.add(3, {"param_version": 1.0, "timing_s/step": 2.0})
    versions.close(2, {"filter/num_generated_groups": 4.0, "filter/num_filtered_groups": 1.0,
                       "filter/kept_ratio": 3 / 4})
    versions.close(2, {"filter/num_generated_groups": 2.0, "filter/num_filtered_groups": 2.0,
                       "filter/kept_ratio": 0.0, "fully_async/count/filtered_groups": 5.0})
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["param_version"], r["synced_version"], r["first_step"], r["last_step"], r["num_steps"])
            for r in records] == [(0, 1, 1, 2, 2), (1, 2, 3, 3, 1)]
    assert records[0]["timing_s/step"] == 2.0
    last = records[1]
    assert (last["filter/num_generated_groups"], last["filter/num_filtered_groups"]) == (6.0, 3.0)
    assert last["filter/kept_ratio"] == pytest.approx(3 / 6)
    assert last["fully_async/count/filtered_groups"] == 5.0
