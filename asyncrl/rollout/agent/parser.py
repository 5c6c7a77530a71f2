"""Tool calls out of a model turn's text: the Hermes / Qwen2.5 format by default, other formats registered.

    turn = TOOL_CALL_PARSERS["hermes"]('I will compute. <tool_call>{"name": "calc", "arguments": {"expr": '
                                       '"12*34"}}</tool_call>')
    turn.content                  # 'I will compute. '  (the text outside the call blocks)
    turn.calls                    # (ToolCall(name='calc', arguments={'expr': '12*34'}, call_id='call_0'),)
    turn.errors                   # () -- malformed or truncated calls, as messages the model reads back

A pure module (text in, records out): the agent loop and the OpenAI-compatible server share it. A parser never
raises on what a model wrote: a call it cannot read becomes an error in `errors`, which the agent loop returns
to the model as a tool message (a parse failure is an observation, not a crash), and the call is not run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from asyncrl.registry import Entry, Registry, column

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: the tool's name and its arguments (a JSON object)."""
    name: str
    arguments: dict[str, Any]
    call_id: str = ""

    def as_message_call(self) -> dict[str, Any]:
        """The OpenAI `tool_calls` entry; `arguments` stays a dict, which chat templates encode once."""
        return {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ParsedTurn:
    """A model turn split into its text and its calls; `errors` holds one message per call that could not be
    read (in the order written), and `is_truncated` says a call was cut off before its closing tag."""
    content: str
    calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()
    is_truncated: bool = False

    @property
    def num_attempts(self) -> int:
        """Calls the model tried to make, readable or not."""
        return len(self.calls) + len(self.errors)


@dataclass(frozen=True)
class ToolCallParserSpec(Entry):
    """A tool-call format: `fn(text) -> ParsedTurn`."""
    open_tag: str = column("opens a call", "")


TOOL_CALL_PARSERS: Registry[ToolCallParserSpec] = Registry("tool-call format", ToolCallParserSpec)


def call_from_json(value: Any, call_id: str) -> ToolCall | str:
    """A ToolCall from a decoded JSON value, or the reason it is not one. `arguments` may be an object or a
    string holding one (some models double-encode it); missing arguments are an empty object."""
    if not isinstance(value, dict):
        return f"a tool call must be a JSON object with 'name' and 'arguments', got {type(value).__name__}"
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return f"a tool call needs a string 'name', got {json.dumps(value)[:200]}"
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            return f"tool call {name!r}: 'arguments' is a string that is not JSON ({error.msg})"
    if not isinstance(arguments, dict):
        return f"tool call {name!r}: 'arguments' must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name, arguments, call_id)


def thinking_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) of each <think>...</think> block (an unclosed one runs to the end): calls written while
    reasoning are not calls."""
    spans, position = [], 0
    while (start := text.find(THINK_OPEN, position)) >= 0:
        end = text.find(THINK_CLOSE, start)
        end = len(text) if end < 0 else end + len(THINK_CLOSE)
        spans.append((start, end))
        position = end
    return spans


@TOOL_CALL_PARSERS.register("hermes", open_tag=HERMES_OPEN,
                            summary='<tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks after the '
                                    "content (Hermes, Qwen2.5)")
def parse_hermes(text: str) -> ParsedTurn:
    """Reads every <tool_call> block. The JSON is decoded from the opening tag on (so a `</tool_call>` inside
    an argument string does not end the call early); a block whose JSON does not parse ends at the next
    closing tag and becomes an error; an opening tag without a closing one is a truncated call."""
    decoder = json.JSONDecoder()
    thinking = thinking_spans(text)
    content_parts: list[str] = []
    calls: list[ToolCall] = []
    errors: list[str] = []
    is_truncated = False
    position = 0
    while True:
        start = text.find(HERMES_OPEN, position)
        while start >= 0 and any(low <= start < high for low, high in thinking):
            start = text.find(HERMES_OPEN, start + 1)
        if start < 0:
            content_parts.append(text[position:])
            break
        content_parts.append(text[position:start])
        body_start = start + len(HERMES_OPEN)
        index = len(calls) + len(errors)
        body = text[body_start:]
        stripped = len(body) - len(body.lstrip())
        try:
            value, consumed = decoder.raw_decode(body, stripped)
        except json.JSONDecodeError as error:
            value, consumed, decode_error = None, 0, error
        else:
            decode_error = None
        if decode_error is None and body[consumed:].lstrip().startswith(HERMES_CLOSE):
            close = body_start + consumed + body[consumed:].index(HERMES_CLOSE)
            call = call_from_json(value, f"call_{index}")
            if isinstance(call, ToolCall):
                calls.append(call)
            else:
                errors.append(call)
            position = close + len(HERMES_CLOSE)
            continue
        close = text.find(HERMES_CLOSE, body_start)
        if close < 0:
            is_truncated = True
            errors.append(f"tool call {index} was cut off before {HERMES_CLOSE} (the turn ended inside it)")
            break
        reason = (f"its JSON does not parse ({decode_error.msg} at character {decode_error.pos - stripped})"
                  if decode_error is not None else f"text follows the JSON object before {HERMES_CLOSE}")
        errors.append(f"tool call {index} is malformed: {reason}: {text[body_start:close].strip()[:200]!r}")
        position = close + len(HERMES_CLOSE)
    return ParsedTurn("".join(content_parts), tuple(calls), tuple(errors), is_truncated)


def get_parser(name: str) -> Callable[[str], ParsedTurn]:
    """The parser registered as `name` (rollout.multi_turn.format); an unknown name names the closest one."""
    return TOOL_CALL_PARSERS.spec(name).fn
