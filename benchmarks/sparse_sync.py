"""Sparse weight sync on the demo in bf16 on CPU: per sync, the fraction of elements that changed and the bytes
sent, against a dense sync of the same weights.

    python benchmarks/sparse_sync.py --out outputs/sparse_sync                   # one_step_off, 20 steps
    python benchmarks/sparse_sync.py --runs 2 --steps 40 trainer.mode=...        # more, and any demo override

Each run is the demo (its SFT warm start, made once and cached) trained with `model.dtype=bfloat16` (bf16 engines,
bf16 mixed precision in the trainer) and `weight_sync.encoding=sparse`, in one_step_off (one sync a step). It
reads `weight_sync/bytes`, `weight_sync/dense_bytes` and `weight_sync/changed_fraction` of every step from
`metrics.jsonl` (the first sync of a new group is dense) and writes one JSON file: per run the per-sync rows, and
the median, min and max over the syncs after the first, with the load average around each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from asyncrl.launch.demo import prepare_setup, run_demo
from asyncrl.telemetry import read_metrics

NAMES = ("weight_sync/bytes", "weight_sync/dense_bytes", "weight_sync/changed_fraction")


def sync_rows(output_dir: str) -> list[dict[str, float]]:
    return [{"step": row["step"], **{name.split("/")[1]: row[name] for name in NAMES}}
            for row in read_metrics(Path(output_dir) / "metrics.jsonl") if NAMES[0] in row]


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="arithmetic")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", default="outputs/sparse_sync")
    parser.add_argument("--result", default=None, help="the JSON file (default OUT/sparse_sync_TASK.json)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    options = parser.parse_args()
    prepare_setup(options.out, options.task)
    overrides = ["model.dtype=bfloat16", "weight_sync.encoding=sparse", f"trainer.total_steps={options.steps}",
                 "trainer.test_freq=-1", *options.overrides]
    runs = []
    for index in range(options.runs):
        load_before, began = os.getloadavg()[0], time.monotonic()
        summary = run_demo(options.out, "one_step_off", overrides, options.task)
        rows = sync_rows(summary["output_dir"])
        later = rows[1:]
        runs.append({"run": index, "seconds": time.monotonic() - began, "load_before": load_before,
                     "load_after": os.getloadavg()[0], "syncs": rows,
                     "final_accuracy": summary["final_validation"].get("val/score/mean"),
                     "changed_fraction": spread([row["changed_fraction"] for row in later]),
                     "bytes_over_dense": spread([row["bytes"] / row["dense_bytes"] for row in later])})
        print(f"[sparse_sync] run {index}: {len(rows)} syncs; after the first, changed fraction "
              f"{runs[-1]['changed_fraction']}, bytes / dense {runs[-1]['bytes_over_dense']} "
              f"(dense {rows[0]['dense_bytes']:.0f} B)", flush=True)
    result = Path(options.result or Path(options.out) / f"sparse_sync_{options.task}.json")
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(json.dumps({"task": options.task, "steps": options.steps, "overrides": overrides,
                                  "runs": runs}, indent=1) + "\n")
    print(f"[sparse_sync] wrote {result}")


if __name__ == "__main__":
    main()
