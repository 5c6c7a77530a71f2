"""The Hermes tool-call parser on valid, malformed, truncated and multiple calls."""

from __future__ import annotations

import pytest

from asyncrl.rollout.agent import TOOL_CALL_PARSERS, ToolCall, get_parser

parse = get_parser("hermes")


def test_one_valid_call_and_the_content_around_it():
    turn = parse('Let me compute.<tool_call>{"name": "calc", "arguments": {"expr": "12*34"}}</tool_call>')
    assert turn.content == "Let me compute."
    assert turn.calls == (ToolCall("calc", {"expr": "12*34"}, "call_0"),)
    assert turn.errors == () and not turn.is_truncated


def test_no_call_is_plain_content():
    turn = parse("408")
    assert (turn.content, turn.calls, turn.errors, turn.num_attempts) == ("408", (), (), 0)


def test_multiple_calls_in_order_with_whitespace_and_newlines():
    text = ('<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    turn = parse(text)
    assert [(call.name, call.arguments, call.call_id) for call in turn.calls] == [("a", {"x": 1}, "call_0"),
                                                                               ("b", {}, "call_1")]
    assert turn.content == "\n"


def test_closing_tag_inside_an_argument_string_does_not_end_the_call():
    turn = parse('<tool_call>{"name": "echo", "arguments": {"text": "a</tool_call>b"}}</tool_call>tail')
    assert turn.calls == (ToolCall("echo", {"text": "a</tool_call>b"}, "call_0"),)
    assert turn.content == "tail"


@pytest.mark.parametrize("body, expected", [
    ('{"name": "calc", "arguments": {"expr": "1+1"}', "does not parse"),     # a missing brace
    ("{'name': 'calc'}", "does not parse"),                                   # single quotes
    ('{"name": "calc", "arguments": {"expr": "1+1"}} junk', "text follows"),
    ('["calc"]', "JSON object"),
    ('{"arguments": {}}', "string 'name'"),
    ('{"name": "calc", "arguments": [1, 2]}', "'arguments' must be a JSON object"),
    ('{"name": "calc", "arguments": "{not json"}', "not JSON"),
])
def test_a_malformed_call_becomes_an_error_and_later_calls_still_parse(body, expected):
    turn = parse(f'x<tool_call>{body}</tool_call>y<tool_call>{{"name": "ok", "arguments": {{}}}}</tool_call>')
    assert len(turn.errors) == 1 and expected in turn.errors[0]
    assert [call.name for call in turn.calls] == ["ok"]
    assert turn.calls[0].call_id == "call_1"   # ids count every attempt, readable or not
    assert turn.content == "xy" and turn.num_attempts == 2


def test_arguments_encoded_as_a_json_string_are_decoded_and_missing_ones_are_empty():
    turn = parse('<tool_call>{"name": "a", "arguments": "{\\"x\\": 2}"}</tool_call>'
                 '<tool_call>{"name": "b"}</tool_call>')
    assert [(call.name, call.arguments) for call in turn.calls] == [("a", {"x": 2}), ("b", {})]


def test_a_call_cut_off_by_the_token_budget_is_truncated():
    turn = parse('Sure.<tool_call>{"name": "calc", "argum')
    assert turn.is_truncated and turn.calls == ()
    assert "cut off" in turn.errors[0]
    assert turn.content == "Sure."
    complete_then_cut = parse('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"na')
    assert [call.name for call in complete_then_cut.calls] == ["a"] and complete_then_cut.is_truncated


def test_calls_inside_thinking_are_not_calls():
    turn = parse('<think>maybe <tool_call>{"name": "no", "arguments": {}}</tool_call></think>'
                 '<tool_call>{"name": "yes", "arguments": {}}</tool_call>')
    assert [call.name for call in turn.calls] == ["yes"]


def test_the_message_call_keeps_arguments_a_dict_and_unknown_formats_are_named():
    call = parse('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>').calls[0]
    assert call.as_message_call() == {"id": "call_0", "type": "function",
                                      "function": {"name": "a", "arguments": {"x": 1}}}
    with pytest.raises(ValueError, match="did you mean 'hermes'"):
        get_parser("hermess")
    assert TOOL_CALL_PARSERS.spec("hermes").open_tag == "<tool_call>"
