"""The code interpreter's sandbox: each misbehaving program ends as a tool error the model reads, and the
executor runs the next call normally afterwards (the run goes on)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from asyncrl.bench import tools as tools_bench
from asyncrl.rollout.agent import ParsedTurn, ToolCall
from asyncrl.rollout.tools import TOOLS, SandboxLimits, ToolExecutor, run_python, sandbox

LIMITS = {"wall_s": 4, "cpu_s": 3, "memory_mb": 256, "max_output_bytes": 4096}
ESCAPE = Path("/tmp/asyncrl_sandbox_escape_test.txt")


def python_executor() -> ToolExecutor:
    tool = TOOLS.spec("python").fn("python", dict(LIMITS), TOOLS.spec("python").schema, None)
    return ToolExecutor({"python": tool}, default_timeout_s=30, max_parallel_calls=2)


def run_code(code: str):
    """The misbehaving program, then a healthy one in the same executor."""
    executor = python_executor()
    turn = ParsedTurn("", (ToolCall("python", {"code": code}, "call_0"),))
    bad = asyncio.run(executor.run(turn, "traj", 0, 0))[0]
    good = asyncio.run(executor.run(ParsedTurn("", (ToolCall("python", {"code": "print(6*7)"}, "call_1"),)),
                                    "traj", 1, 1))[0]
    assert (good.status, good.output) == ("ok", "42\n")
    return bad


def test_an_infinite_loop_is_stopped_at_the_wall_time():
    record = run_code("while True:\n    pass")
    assert record.status in ("timeout", "error")   # the CPU limit (SIGXCPU) or the wall-time kill, whichever first
    assert record.latency_s < 10
    assert "ran past" in record.output or "signal" in record.output


def test_a_fork_bomb_cannot_start_a_process():
    record = run_code("import os\nwhile True:\n    os.fork()")
    assert record.status == "error" and "starting processes is not allowed" in record.output


def test_a_multi_gigabyte_allocation_fails_with_a_memory_error():
    record = run_code("block = bytearray(4 * 1024 ** 3)\nprint(len(block))")
    assert record.status == "error" and "MemoryError" in record.output


def test_a_network_connection_is_refused():
    record = run_code("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\nprint('connected')")
    assert record.status == "error" and "network" in record.output.lower()
    assert "connected" not in record.output


def test_a_huge_output_is_cut_and_the_process_stopped():
    record = run_code("while True:\n    print('x' * 1000)")
    assert record.status == "error" and "printed more than 4096 bytes" in record.output
    assert len(record.output) < 1000


def test_a_write_outside_its_directory_is_refused_inside_allowed():
    ESCAPE.unlink(missing_ok=True)
    record = run_code(f"open({str(ESCAPE)!r}, 'w').write('escaped')")
    assert record.status == "error" and "writing outside the working directory" in record.output
    assert not ESCAPE.exists()
    inside = asyncio.run(run_python("open('notes.txt', 'w').write('hi')\nprint(open('notes.txt').read())",
                                    SandboxLimits(**LIMITS)))
    assert inside.ok and inside.stdout == "hi\n"


def test_each_run_has_its_own_directory_removed_afterwards():
    first = asyncio.run(run_python("import os\nprint(os.getcwd())", SandboxLimits(**LIMITS)))
    second = asyncio.run(run_python("import os\nprint(os.getcwd())", SandboxLimits(**LIMITS)))
    assert first.stdout != second.stdout and not Path(first.stdout.strip()).exists()


@pytest.mark.parametrize("limit", ["wall_s", "memory_mb"])
def test_limits_must_be_positive(limit):
    with pytest.raises(ValueError, match=limit):
        SandboxLimits(**{limit: 0})


def test_without_a_network_namespace_the_audit_hook_still_refuses_the_network(monkeypatch):
    monkeypatch.setattr(sandbox, "network_namespace_prefix", lambda: ())
    run = asyncio.run(run_python("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)",
                                 SandboxLimits(**LIMITS), isolated=False))
    assert not run.network_isolated and run.exit_code == 1
    assert "network access is not allowed" in run.stderr


def test_the_tools_bench_times_both_modes_and_records_the_load(tmp_path):
    output = tmp_path / "tools.jsonl"
    assert tools_bench.main(["--calls", "2", "--concurrency", "2", "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    assert set(result["modes"]) == {"bubblewrap", "audit_hook_only"}
    for numbers in result["modes"].values():
        assert 0 < numbers["min_ms"] <= numbers["median_ms"] <= numbers["p90_ms"] and numbers["calls_per_s"] > 0
    assert len(result["load_average_before"]) == 3 and result["cpus"] >= 1
