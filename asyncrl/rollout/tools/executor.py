"""Run one turn's tool calls: concurrently, each under its timeout, every outcome a message the model reads.

    executor = ToolExecutor(tools, default_timeout_s=30, max_parallel_calls=2)
    records = await executor.run(turn, trajectory_id="g3/0", turn_index=1, first_call_index=0)

One record per call the model tried, in the order written: "ok" with the tool's text; "parse_error" for a
call that could not be read; "unknown_tool" naming the tools there are; "skipped" past max_parallel_calls;
"timeout"; "error" for a tool that raised or returned garbage. Nothing here raises for what a tool or the
model did: an infrastructure fault fails one call, never the run. A running call is never cancelled by a
weight sync (only its own timeout stops it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from asyncrl.rollout.agent.parser import ParsedTurn, ToolCall
from asyncrl.rollout.agent.trajectory import ToolCallRecord
from asyncrl.rollout.tools.base import CallContext, Tool, ToolError, ToolTimeout


class ToolExecutor:
    def __init__(self, tools: dict[str, Tool], default_timeout_s: float, max_parallel_calls: int):
        self.tools = tools
        self.default_timeout_s = default_timeout_s
        self.max_parallel_calls = max_parallel_calls

    def schemas(self) -> list[dict[str, Any]]:
        return [tool.schema for tool in self.tools.values()]

    async def run(self, turn: ParsedTurn, trajectory_id: str, turn_index: int, first_call_index: int,
                  extra_info: dict[str, Any] | None = None) -> list[ToolCallRecord]:
        records: list[ToolCallRecord | None] = []
        running = []
        for call in turn.calls:
            if len(running) >= self.max_parallel_calls:
                records.append(ToolCallRecord(turn_index, call.name, call.arguments, "skipped",
                               f"not run: at most {self.max_parallel_calls} tool call(s) per turn"))
                continue
            context = CallContext(trajectory_id, first_call_index + len(records), dict(extra_info or {}))
            running.append((len(records), asyncio.ensure_future(self.run_call(call, turn_index, context))))
            records.append(None)
        for error in turn.errors:
            records.append(ToolCallRecord(turn_index, "", {}, "parse_error", error))
        for position, task in running:
            records[position] = await task
        return records

    async def run_call(self, call: ToolCall, turn_index: int, context: CallContext) -> ToolCallRecord:
        if call.name not in self.tools:
            return ToolCallRecord(turn_index, call.name, call.arguments, "unknown_tool",
                                  f"unknown tool {call.name!r}; the tools are: {', '.join(self.tools)}")
        tool = self.tools[call.name]
        timeout_s = tool.timeout_s if tool.timeout_s is not None else self.default_timeout_s
        started = time.monotonic()
        try:
            output = await asyncio.wait_for(tool.call(call.arguments, context), timeout_s)
            status = "ok"
        except (asyncio.TimeoutError, ToolTimeout) as error:
            status = "timeout"
            output = str(error) if isinstance(error, ToolTimeout) else \
                f"tool {call.name!r} timed out after {timeout_s:g} s"
        except ToolError as error:
            status, output = "error", f"tool {call.name!r} failed: {error}"
        except TypeError as error:   # arguments that do not match the function's signature, mostly
            status, output = "error", f"tool {call.name!r} rejected its arguments: {error}"
        except Exception as error:   # a user tool may raise anything; the model reads it, the run goes on
            status, output = "error", f"tool {call.name!r} raised {type(error).__name__}: {error}"
        return ToolCallRecord(turn_index, call.name, call.arguments, status, output, time.monotonic() - started)
