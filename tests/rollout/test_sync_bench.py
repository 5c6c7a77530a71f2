"""`asyncrl bench sync` on CPU (gloo): it times a real sync next to a raw broadcast of the same bytes, and
checks that after one more sync of moved trainer weights every engine tensor is bitwise the trainer's."""

from __future__ import annotations

from asyncrl.bench.sync import run_sync_benchmark


def test_sync_bench_measures_and_verifies_the_transfer_on_cpu():
    result = run_sync_benchmark("tiny-test", device="cpu", bucket_mb=8, repeats=1)
    assert result["bitwise_equal"] is True
    assert result["buckets"] >= -(-result["bytes"] // (8 << 20)) > 1  # 8 MiB buckets, several of them
    assert result["sync_s"] > 0 and result["raw_s"] > 0 and 0 < result["fraction_of_raw"]
    assert result["gather_s"] > 0 and result["load_s"] > 0
