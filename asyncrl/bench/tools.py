"""Tool-call latency of the python tool: under its OS sandbox (bubblewrap) against the audit hook alone.

    asyncrl bench tools                          # 40 calls per mode, one at a time, then 4 at once
    asyncrl bench tools --calls 100 --concurrency 8

Each call goes through `PythonTool.call`, as the agent loop makes it: a fresh interpreter in a fresh directory
runs a small program (a sum and a print) and its output comes back. Per mode the bench reports the median and
90th percentile of one call's latency (calls one at a time, after 3 that warm up), and calls per second with
`--concurrency` calls in flight. The machine's load average is recorded beside: on a shared machine the
numbers move with it. Appends one JSON line to `--output` (default `outputs/bench/tools.jsonl`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time
from typing import Any

from asyncrl.bench.results import append_result, default_output
from asyncrl.rollout.tools import TOOLS, CallContext
from asyncrl.rollout.tools.python_tool import UNSAFE_KEY

PROGRAM = "print(sum(range(100_000)))"
EXPECTED = f"{sum(range(100_000))}\n"
WARM_UP_CALLS = 3
MODES = {"bubblewrap": False, "audit_hook_only": True}   # mode -> unsafe_without_os_isolation


def python_tool(unsafe: bool):
    spec = TOOLS.spec("python")
    return spec.fn("python", {"wall_s": 30, UNSAFE_KEY: unsafe}, spec.schema, None)


async def one_call(tool: Any, index: int) -> float:
    started = time.perf_counter()
    output = await tool.call({"code": PROGRAM}, CallContext("bench", index))
    if output != EXPECTED:
        raise RuntimeError(f"the python tool answered {output!r}, expected {EXPECTED!r}")
    return time.perf_counter() - started


async def measure(unsafe: bool, calls: int, concurrency: int) -> dict[str, float]:
    tool = python_tool(unsafe)
    for index in range(WARM_UP_CALLS):
        await one_call(tool, index)
    latencies = sorted([await one_call(tool, index) for index in range(calls)])
    slots = asyncio.Semaphore(concurrency)

    async def limited(index: int) -> float:
        async with slots:
            return await one_call(tool, index)

    started = time.perf_counter()
    await asyncio.gather(*(limited(index) for index in range(calls)))
    seconds = time.perf_counter() - started
    return {"median_ms": 1000 * statistics.median(latencies),
            "p90_ms": 1000 * latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))],
            "min_ms": 1000 * latencies[0], "calls_per_s": calls / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl bench tools", description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="timed calls per mode and measure (default 40)")
    parser.add_argument("--concurrency", type=int, default=4, help="calls in flight for calls/s (default 4)")
    parser.add_argument("--output", default=str(default_output("tools.jsonl")))
    options = parser.parse_args(argv)
    load_before = os.getloadavg()
    results = {mode: asyncio.run(measure(unsafe, options.calls, options.concurrency)) for mode, unsafe in MODES.items()}
    result = {"bench": "tools", "calls": options.calls, "concurrency": options.concurrency, "modes": results,
              "slowdown_median": results["bubblewrap"]["median_ms"] / results["audit_hook_only"]["median_ms"],
              "cpus": os.cpu_count(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "machine": platform.platform(), "date": time.strftime("%Y-%m-%d")}
    print(f"{'mode':<18}{'median ms':>11}{'p90 ms':>9}{'min ms':>9}{'calls/s':>10}")
    for mode, numbers in results.items():
        print(f"{mode:<18}{numbers['median_ms']:>11.1f}{numbers['p90_ms']:>9.1f}{numbers['min_ms']:>9.1f}"
              f"{numbers['calls_per_s']:>10.2f}")
    print(f"bubblewrap / audit hook only, median: {result['slowdown_median']:.2f}x; load average "
          f"{load_before[0]:.1f} -> {result['load_average_after'][0]:.1f} on {os.cpu_count()} CPUs")
    path = append_result(options.output, result)
    print(f"appended the result to {path.resolve()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
