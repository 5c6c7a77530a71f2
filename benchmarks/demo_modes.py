"""The demo in several modes, run after run, as a user compares them: validation accuracy before, during and
after RL, RL time and whole-demo time per run, the machine's load, one JSON file.

    python benchmarks/demo_modes.py --task longtail --modes sync fully_async --runs 2 --out outputs/demo_modes
    python benchmarks/demo_modes.py --task longtail --load 1 ...    # beside one process spinning on a core

The set-up (data and SFT warm start) is made once and reused by every run (`prepare_setup`'s cache), so the
first run's whole-demo time includes it and the others' do not; the JSON keeps both times for each run.
`--load N` starts N processes that each keep a core busy (a fixed synthetic neighbour) for the whole benchmark.
Each run records the load average before and after it and the OpenMP wait policy the runs used; times taken on
a machine shared with other work are not comparable with idle ones.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path

from asyncrl.launch.demo import prepare_setup, run_demo
from asyncrl.telemetry import read_metrics


def spin() -> None:
    while True:
        pass


def validation_curve(output_dir: str) -> list[dict[str, float]]:
    """(step, seconds since the run's start, greedy accuracy) at every validation of the run."""
    return [{"step": row["step"], "wall_time_s": row["wall_time_s"], "accuracy": row["val/score/mean"]}
            for row in read_metrics(Path(output_dir) / "metrics.jsonl") if "val/score/mean" in row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="longtail")
    parser.add_argument("--modes", nargs="+", default=["sync", "fully_async"])
    parser.add_argument("--runs", type=int, default=1, help="rounds over the modes, interleaved")
    parser.add_argument("--load", type=int, default=0, help="processes keeping a core busy meanwhile")
    parser.add_argument("--out", default="outputs/demo_modes")
    parser.add_argument("--result", default=None, help="the JSON file (default OUT/demo_modes_TASK.json)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    options = parser.parse_args()
    started = time.monotonic()
    prepare_setup(options.out, options.task)
    setup_s = time.monotonic() - started
    load = [multiprocessing.Process(target=spin, daemon=True) for _ in range(options.load)]
    for process in load:
        process.start()
    runs = []
    try:
        for round_index in range(options.runs):
            for mode in options.modes:
                began, load_before = time.monotonic(), os.getloadavg()[0]
                summary = run_demo(options.out, mode, list(options.overrides), options.task)
                runs.append({"round": round_index, "mode": mode, "demo_s": time.monotonic() - began,
                             "rl_s": summary["wall_time_s"], "steps": summary["steps"],
                             "samples": summary["samples"], "before": summary["initial_validation"]["val/score/mean"],
                             "after": summary["final_validation"]["val/score/mean"],
                             "validations": validation_curve(summary["output_dir"]),
                             "load_average_before": load_before, "load_average_after": os.getloadavg()[0]})
                print(f"[demo modes] {json.dumps(runs[-1])}", flush=True)
    finally:
        for process in load:
            process.terminate()
    result = Path(options.result or Path(options.out) / f"demo_modes_{options.task}.json")
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(json.dumps({"task": options.task, "overrides": options.overrides, "setup_s": setup_s,
                                  "synthetic_load_processes": options.load, "cpus": os.cpu_count(),
                                  "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
                                  "runs": runs}, indent=1) + "\n")
    print(f"wrote {result}")


if __name__ == "__main__":
    main()
