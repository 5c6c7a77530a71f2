"""The tool YAML (`rollout.multi_turn.tool_config_path`), in verl's shape:

    tools:
      - class_name: calculator                 # a built-in (TOOLS), 'path/file.py:function' or 'package.module:Class'
        config: {timeout_s: 5, latency: "lognormal:0.5:10"}   # optional; the rest goes to the tool
        tool_schema:                           # the OpenAI function schema; optional for a built-in
          type: function
          function: {name: calc, description: ..., parameters: {...}}

A function (plain or `async def`) is called with the call's arguments as keywords; a class is built once
with the entry's config as keywords and its instances are called the same way. Relative file paths are read
from the YAML file's folder. Every error names the file, the entry and the key.
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import yaml

from asyncrl.config.user_code import ImportFailed, MissingAttribute, MissingFile, load_attribute, split_spec
from asyncrl.rollout.tools.base import TOOLS, CallContext, FunctionTool, Tool
from asyncrl.rollout.tools.latency import LatencyDistribution

ENTRY_KEYS = {"class_name", "config", "tool_schema"}


class ToolConfigError(ValueError):
    """The tool YAML or a tool it names cannot be used; the message names the file, entry and key."""


class DelayedTool(Tool):
    """A tool behind a simulated latency (benchmarks): waits the drawn delay, then calls the tool."""

    def __init__(self, tool: Tool, latency: LatencyDistribution):
        self.tool, self.latency = tool, latency
        self.name, self.schema, self.timeout_s = tool.name, tool.schema, tool.timeout_s

    async def call(self, arguments: dict[str, Any], context: CallContext) -> str:
        await asyncio.sleep(self.latency.delay_s(context.trajectory_id, context.call_index))
        return await self.tool.call(arguments, context)


def load_tools(path: str | Path) -> dict[str, Tool]:
    """name -> Tool for every entry of the file."""
    path = Path(path)
    if not path.is_file():
        raise ToolConfigError(f"rollout.multi_turn.tool_config_path: {path} does not exist")
    try:
        document = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ToolConfigError(f"{path} is not valid YAML: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("tools"), list) or not document["tools"]:
        raise ToolConfigError(f"{path} must hold a non-empty list under 'tools:'")
    tools: dict[str, Tool] = {}
    for index, entry in enumerate(document["tools"]):
        tool = build_tool(entry, path, f"{path}: tools[{index}]")
        if tool.name in tools:
            raise ToolConfigError(f"{path}: tools[{index}]: a second tool named {tool.name!r}")
        tools[tool.name] = tool
    return tools


def build_tool(entry: Any, path: Path, where: str) -> Tool:
    if not isinstance(entry, dict) or "class_name" not in entry:
        raise ToolConfigError(f"{where} must be a mapping with class_name (and optionally config, tool_schema)")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise ToolConfigError(f"{where}: unknown key(s) {sorted(unknown)}; valid: {sorted(ENTRY_KEYS)}")
    class_name = str(entry["class_name"])
    config = dict(entry.get("config") or {})
    timeout_s = config.pop("timeout_s", None)
    latency = config.pop("latency", None)
    if timeout_s is not None and (not isinstance(timeout_s, (int, float)) or timeout_s <= 0):
        raise ToolConfigError(f"{where}: config.timeout_s must be a positive number of seconds, got {timeout_s!r}")
    schema = entry.get("tool_schema")
    if class_name in TOOLS:
        spec = TOOLS.spec(class_name)
        schema = schema if schema is not None else spec.schema
        name = schema_name(schema, where)
        try:
            tool = spec.fn(name, config, schema, timeout_s)
        except (TypeError, ValueError) as error:
            raise ToolConfigError(f"{where}: config: {error}") from None
    else:
        if ":" not in class_name:
            raise unknown_class_name(class_name, where)
        if schema is None:
            raise ToolConfigError(f"{where}: tool_schema is required for a user tool ({class_name})")
        name = schema_name(schema, where)
        tool = FunctionTool(name, load_callable(class_name, config, path, where), schema, timeout_s)
    if latency is not None:
        try:
            tool = DelayedTool(tool, LatencyDistribution.parse(latency))
        except ValueError as error:
            raise ToolConfigError(f"{where}: config.latency: {error}") from None
    return tool


def schema_name(schema: Any, where: str) -> str:
    function = schema.get("function") if isinstance(schema, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise ToolConfigError(f"{where}: tool_schema must be an OpenAI function schema "
                              "{type: function, function: {name: ..., parameters: ...}}")
    return name


def unknown_class_name(class_name: str, where: str) -> ToolConfigError:
    return ToolConfigError(f"{where}: class_name {class_name!r} is no built-in ({', '.join(TOOLS)}) and does not "
                           "look like 'path/file.py:function' or 'package.module:Class'")


def load_callable(class_name: str, config: dict[str, Any], path: Path, where: str):
    """The user tool `class_name` names (a file relative to the YAML's folder, or a module): a function, or an
    instance of a class built with the entry's config."""
    spec = split_spec(class_name)
    if spec is None:
        raise unknown_class_name(class_name, where)
    try:
        target = load_attribute(spec, kind="tool", folder=path.parent)
    except MissingFile as failure:
        raise ToolConfigError(f"{where}: class_name: file {failure.file} does not exist") from None
    except ImportFailed as failure:
        raise ToolConfigError(f"{where}: class_name: {spec.location} failed to import: {failure.cause}") from None
    except MissingAttribute:
        target = None
    if target is None or not callable(target):
        raise ToolConfigError(f"{where}: class_name: {spec.location} defines no callable {spec.name!r}")
    if inspect.isclass(target):
        try:
            return target(**config)
        except Exception as error:
            raise ToolConfigError(f"{where}: building {class_name} with config {config}: "
                                  f"{type(error).__name__}: {error}") from None
    if config:
        raise ToolConfigError(f"{where}: config keys {sorted(config)} given to function {class_name}, which takes "
                              "none (only timeout_s and latency apply)")
    return target
