"""What a tool is: an async call from JSON arguments to the text the model reads, with its OpenAI schema.

    class Tool:  name, schema, timeout_s;  async def call(arguments: dict, context: CallContext) -> str

A tool that cannot answer raises `ToolError` (the model reads the message) or `ToolTimeout`; anything else it
raises is caught by the executor and becomes an error message too. User code enters through `FunctionTool`:
any callable, plain or `async def` (a class instance with `__call__` included), called with the arguments
as keywords; a plain one runs in a worker thread, never on the event loop. What it returns becomes text: a
string as it is, a number, bool or JSON-serialisable list/dict as JSON; anything else (None, an object) is
an error the model reads ("returned garbage").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable

from asyncrl.registry import Entry, Registry, column

# Plain (synchronous) tools run here, not in asyncio's default pool: a tool that hangs past its timeout
# keeps its thread, and must not starve the engine's or the reward's threads.
TOOL_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="asyncrl-tool")


class ToolError(Exception):
    """A tool's failure, worded for the model: the message becomes the tool result."""


class ToolTimeout(ToolError):
    """The tool ran past its time limit (and was stopped, where it runs in a process)."""


@dataclass(frozen=True)
class CallContext:
    """Who calls: the trajectory (its request id), which call of it, and the prompt's extra_info."""
    trajectory_id: str
    call_index: int
    extra_info: dict[str, Any] = field(default_factory=dict)


class Tool(ABC):
    name: str
    schema: dict[str, Any]      # the OpenAI function schema: {"type": "function", "function": {...}}
    timeout_s: float | None     # None: rollout.multi_turn.tool_timeout_s

    @abstractmethod
    async def call(self, arguments: dict[str, Any], context: CallContext) -> str:
        ...


def as_tool_text(value: Any, name: str) -> str:
    """A tool's return value as the text the model reads; ToolError for what has no such form."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float, list, dict)):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            pass
    raise ToolError(f"tool {name!r} returned {type(value).__name__}, which is not text, a number or JSON")


def is_async_callable(function: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(type(function).__call__)


class FunctionTool(Tool):
    """A user function (or callable object) as a tool."""

    def __init__(self, name: str, function: Callable[..., Any], schema: dict[str, Any], timeout_s: float | None):
        self.name, self.function, self.schema, self.timeout_s = name, function, schema, timeout_s
        self.is_async = is_async_callable(function)

    async def call(self, arguments: dict[str, Any], context: CallContext) -> str:
        if self.is_async:
            value = await self.function(**arguments)
        else:
            loop = asyncio.get_running_loop()
            value = await loop.run_in_executor(TOOL_THREADS, functools.partial(self.function, **arguments))
        return as_tool_text(value, self.name)


@dataclass(frozen=True)
class ToolSpec(Entry):
    """A built-in tool: `fn(name, config, schema, timeout_s) -> Tool`; `schema` is the default schema."""
    schema: dict[str, Any] = field(default_factory=dict)
    runs: str = column("runs", "in a thread")


TOOLS: Registry[ToolSpec] = Registry("built-in tool", ToolSpec)


def function_schema(name: str, description: str, parameters: dict[str, str]) -> dict[str, Any]:
    """An OpenAI function schema with required string parameters {name: description}."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {key: {"type": "string", "description": text}
                                                        for key, text in parameters.items()},
                       "required": list(parameters)}}}
