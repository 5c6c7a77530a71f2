"""`asyncrl.bench.trainer` on one and on two ranks, on CPU (gloo), with the same global batch: two ranks
split its rows, so they report the same tokens per update and train the same update (loss, entropy and
gradient norm reduced over ranks), with one peak-memory entry per rank (None on CPU: no allocator statistics)."""

from __future__ import annotations

import pytest

from asyncrl.bench.trainer import main, run_trainer_benchmark

# 4 rows of 64 tokens: one rank packs them into 2 micro-batches of 128 tokens, two ranks into 1 each.
SHAPE = dict(model="tiny-test", micro_tokens=128, seq_len=64, num_micro_batches=2, num_updates=1, device="cpu")


def test_two_ranks_measure_the_same_global_update_as_one_rank():
    one = run_trainer_benchmark(**SHAPE, world_size=1)
    two = run_trainer_benchmark(**SHAPE, world_size=2)
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["tokens_per_update"] == two["tokens_per_update"] == 4 * 64
    assert one["peak_memory_gib_per_rank"] == [None] and two["peak_memory_gib_per_rank"] == [None, None]
    assert one["peak_memory_gib"] is None and two["peak_memory_gib"] is None
    for result in (one, two):
        assert result["seconds_per_update"] > 0 and result["tokens_per_s"] > 0 and result["tflops"] > 0
        assert result["mfu"] is None  # a GPU's peak is no yardstick on a CPU
    assert one["metrics"]["actor/grad_norm"] > 0 and one["metrics"]["actor/pg_loss"] != 0
    for name in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert two["metrics"][name] == pytest.approx(one["metrics"][name], rel=1e-4, abs=1e-7)


def test_help_documents_the_world_size(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "--world-size" in capsys.readouterr().out


def test_a_world_size_that_does_not_divide_the_rows_is_refused():
    with pytest.raises(ValueError, match="world_size must divide"):
        run_trainer_benchmark(**{**SHAPE, "num_micro_batches": 3, "micro_tokens": 64}, world_size=2)


def test_the_cpu_trainer_step_runs_on_the_side_by_side_model():
    """`cpu-3m` (the TRL side by side's model): its FLOPs per update follow the shapes, by hand."""
    result = run_trainer_benchmark(model="cpu-3m", micro_tokens=144, seq_len=72, num_micro_batches=1, num_updates=1,
                                   device="cpu")
    assert result["rows"] == 2 and result["tokens_per_update"] == 144
    per_layer = 256 * (256 + 2 * 128) + 256 * 256 + 3 * 256 * 688  # q, k, v; o; gate, up, down
    linear, head = 2 * per_layer * 4 * 144, 2 * 256 * 103 * 2 * 63  # the head on the 63 response tokens of each row
    attention = 2 * 2 * 4 * 256 * 36 * 144
    assert result["tflops"] * 1e12 * result["seconds_per_update"] == pytest.approx(3 * (linear + head + attention))
    assert result["metrics"]["actor/grad_norm"] > 0
