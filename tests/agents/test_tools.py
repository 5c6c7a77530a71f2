"""Tools: the calculator, the tool YAML (built-ins, user functions and classes, sync and async), latency, and
the executor's promise that a tool that raises, hangs or returns garbage becomes a message, never a crash."""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time

import pytest
import yaml

from asyncrl.rollout.agent import ParsedTurn, ToolCall
from asyncrl.rollout.tools import CallContext, LatencyDistribution, ToolConfigError, ToolExecutor, load_tools
from asyncrl.rollout.tools.calculator import calculate
from asyncrl.rollout.tools.base import ToolError

USER_TOOLS = '''
import asyncio, threading, time

def add(a, b):
    return {"sum": a + b, "thread": threading.current_thread().name}

async def slow_echo(text):
    await asyncio.sleep(0.3)
    return text

def hang():
    time.sleep(3)
    return "late"

def explode():
    raise RuntimeError("kaboom")

def garbage():
    return object()

class Counter:
    def __init__(self, start):
        self.count = start
    def __call__(self):
        self.count += 1
        return self.count
'''


def schema(name):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture()
def tool_file(tmp_path):
    (tmp_path / "my_tools.py").write_text(USER_TOOLS)
    entries = [{"class_name": "calculator"}]
    for name in ("add", "slow_echo", "explode", "garbage"):
        entries.append({"class_name": f"my_tools.py:{name}", "tool_schema": schema(name)})
    entries.append({"class_name": "my_tools.py:hang", "tool_schema": schema("hang"), "config": {"timeout_s": 0.5}})
    entries.append({"class_name": "my_tools.py:Counter", "tool_schema": schema("counter"), "config": {"start": 10}})
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": entries}))
    return path


def call(name, **arguments):
    return ToolCall(name, arguments, "")


def run(executor, *calls, errors=()):
    return asyncio.run(executor.run(ParsedTurn("", tuple(calls), tuple(errors)), "traj", 0, 0))


@pytest.mark.parametrize("expression, expected", [("1234*5678", "7006652"), ("(2+3)*-4", "-20"), ("7/2", "3.5"),
                                                  ("2**10", "1024"), ("1/3", "0.3333333333"), ("10//3 + 10%3", "4")])
def test_the_calculator_is_exact(expression, expected):
    assert calculate(expression) == expected


@pytest.mark.parametrize("expression, message", [("__import__('os')", "unsupported"), ("9**9**9", "exponents"),
                                                 ("1/0", "division by zero"), ("2+", "cannot parse"), ("", "non-empty")])
def test_the_calculator_refuses_what_is_not_arithmetic(expression, message):
    with pytest.raises(ToolError, match=message):
        calculate(expression)


def test_every_failure_becomes_a_message_and_good_calls_still_answer(tool_file):
    executor = ToolExecutor(load_tools(tool_file), default_timeout_s=5, max_parallel_calls=8)
    records = run(executor, call("calc", expr="12*34"), call("explode"), call("garbage"), call("hang"),
                  call("nope"), call("add", a=1), errors=["tool call 6 is malformed: ..."])
    assert [(record.name, record.status) for record in records] == [
        ("calc", "ok"), ("explode", "error"), ("garbage", "error"), ("hang", "timeout"), ("nope", "unknown_tool"),
        ("add", "error"), ("", "parse_error")]
    assert records[0].output == "408"
    assert "RuntimeError: kaboom" in records[1].output
    assert "returned object" in records[2].output
    assert "timed out after 0.5 s" in records[3].output and records[3].latency_s < 2
    assert "the tools are: calc, add" in records[4].output
    assert "rejected its arguments" in records[5].output


def test_sync_tools_run_off_the_event_loop_and_calls_run_concurrently(tool_file):
    executor = ToolExecutor(load_tools(tool_file), default_timeout_s=5, max_parallel_calls=4)
    started = time.monotonic()
    records = run(executor, call("slow_echo", text="a"), call("slow_echo", text="b"), call("slow_echo", text="c"),
                  call("add", a=2, b=3))
    elapsed = time.monotonic() - started
    # Three 0.3 s calls together, not one after another: one after another they would take at least the sum of
    # their own durations (whatever the machine's load stretches each to); together, about the longest one.
    assert elapsed < sum(record.latency_s for record in records[:3]), (elapsed, records[:3])
    assert [record.output for record in records[:3]] == ["a", "b", "c"]
    assert '"sum": 5' in records[3].output and threading.main_thread().name not in records[3].output


def test_calls_past_max_parallel_calls_are_skipped_with_a_message(tool_file):
    executor = ToolExecutor(load_tools(tool_file), default_timeout_s=5, max_parallel_calls=1)
    records = run(executor, call("calc", expr="1+1"), call("calc", expr="2+2"))
    assert [(record.status, record.output) for record in records] == [
        ("ok", "2"), ("skipped", "not run: at most 1 tool call(s) per turn")]


def test_a_class_tool_is_built_once_with_its_config(tool_file):
    executor = ToolExecutor(load_tools(tool_file), default_timeout_s=5, max_parallel_calls=1)
    assert [run(executor, call("counter"))[0].output for _ in range(2)] == ["11", "12"]


@pytest.mark.parametrize("entries, message", [
    ([{"class_name": "calculator", "bogus": 1}], r"tools\[0\]: unknown key\(s\) \['bogus'\]"),
    ([{"class_name": "missing.py:f", "tool_schema": schema("f")}], "missing.py does not exist"),
    ([{"class_name": "my_tools.py:add"}], "tool_schema is required"),
    ([{"class_name": "my_tools.py:nothing", "tool_schema": schema("x")}], "defines no callable 'nothing'"),
    ([{"class_name": "calculator"}, {"class_name": "calculator"}], r"tools\[1\]: a second tool named 'calc'"),
    ([{"class_name": "calculator", "config": {"latency": "soon"}}], "config.latency"),
    ([{"class_name": "calculator", "config": {"timeout_s": -1}}], "config.timeout_s"),
    ([{"class_name": "calculator", "config": {"colour": "red"}}], "unknown config keys"),
    ([{"class_name": "calcultor"}], "no built-in"),
    ([{"class_name": ":f", "tool_schema": schema("f")}], r"tools\[0\]: class_name ':f' is no built-in"),
    ([{"class_name": "no_such_tool_module:f", "tool_schema": schema("f")}],
     r"tools\[0\]: class_name: no_such_tool_module failed to import: ModuleNotFoundError: No module named "
     r"'no_such_tool_module'"),
])
def test_a_bad_tool_file_names_the_entry_and_the_key(tmp_path, entries, message):
    (tmp_path / "my_tools.py").write_text(USER_TOOLS)
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": entries}))
    with pytest.raises(ToolConfigError, match=message):
        load_tools(path)


def test_latency_is_drawn_per_call_reproducibly_and_delays_the_tool(tmp_path):
    distribution = LatencyDistribution.parse("lognormal:0.2:1.0")
    delays = [distribution.delay_s("t", index) for index in range(200)]
    assert delays == [distribution.delay_s("t", index) for index in range(200)]
    assert max(delays) <= 1.0 and 0.1 < sorted(delays)[100] < 0.4
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent("""
        tools:
          - class_name: calculator
            config: {latency: "0.3"}
    """))
    tool = load_tools(path)["calc"]
    started = time.monotonic()
    assert asyncio.run(tool.call({"expr": "1+1"}, CallContext("t", 0))) == "2"
    assert time.monotonic() - started >= 0.3
