"""The demo in several modes, run after run, as a user compares them: validation accuracy before and after RL,
RL time and whole-demo time per run, one JSON file.

    python benchmarks/demo_modes.py --task longtail --modes sync fully_async --runs 2 --out outputs/demo_modes

The set-up (data and SFT warm start) is made once and reused by every run (`prepare_setup`'s cache), so the
first run's whole-demo time includes it and the others' do not; the JSON keeps both times for each run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from asyncrl.launch.demo import prepare_setup, run_demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="longtail")
    parser.add_argument("--modes", nargs="+", default=["sync", "fully_async"])
    parser.add_argument("--runs", type=int, default=1, help="rounds over the modes, interleaved")
    parser.add_argument("--out", default="outputs/demo_modes")
    parser.add_argument("--result", default=None, help="the JSON file (default OUT/demo_modes_TASK.json)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    options = parser.parse_args()
    started = time.monotonic()
    prepare_setup(options.out, options.task)
    setup_s = time.monotonic() - started
    runs = []
    for round_index in range(options.runs):
        for mode in options.modes:
            began = time.monotonic()
            summary = run_demo(options.out, mode, list(options.overrides), options.task)
            runs.append({"round": round_index, "mode": mode, "demo_s": time.monotonic() - began,
                         "rl_s": summary["wall_time_s"], "steps": summary["steps"], "samples": summary["samples"],
                         "before": summary["initial_validation"]["val/score/mean"],
                         "after": summary["final_validation"]["val/score/mean"]})
            print(f"[demo modes] {json.dumps(runs[-1])}", flush=True)
    result = Path(options.result or Path(options.out) / f"demo_modes_{options.task}.json")
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(json.dumps({"task": options.task, "overrides": options.overrides, "setup_s": setup_s,
                                  "runs": runs}, indent=1) + "\n")
    print(f"wrote {result}")


if __name__ == "__main__":
    main()
