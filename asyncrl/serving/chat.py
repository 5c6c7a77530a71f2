"""POST /v1/chat/completions: OpenAI messages rendered by the model's chat template (with `tools` when given),
`n` choices, tool calls parsed from the reply, optionally streamed.

    body = {"model": "m", "messages": [{"role": "user", "content": "2+3="}], "tools": [...], "n": 2}
    -> choices[i].message.content / .tool_calls, finish_reason "tool_calls" when the reply called a tool

Tool calls are read by a registered tool-call parser (`asyncrl.rollout.agent.TOOL_CALL_PARSERS`, hermes by
default: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks), the one the agent loop uses. The
engine samples freely: `tool_choice` "required" or a named function is not forced by constrained decoding; a
named function keeps only the calls of that name, "none" leaves the reply's text as it is. A reply whose calls
cannot be read comes back as text, with no tool_calls.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from asyncrl.rollout.agent.parser import ParsedTurn
from asyncrl.serving.choices import Choice, generate_choices, token_texts
from asyncrl.serving.completions import sse, usage_of
from asyncrl.serving.metrics import ServerMetrics
from asyncrl.serving.protocol import (APIError, ChatChoice, ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs,
                                      ChatMessage, ChatToolCall, TokenLogprob, ToolCallFunction, TopLogprob)
from asyncrl.serving.served_model import ServedModel

ROUTE = "/v1/chat/completions"
ROLES = ("system", "user", "assistant", "tool")


def message_text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text" for part in content):
        return "".join(str(part.get("text", "")) for part in content)
    raise APIError(400, f"{where}: content must be a string or a list of text parts (this model reads text only)",
                   param=where)


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages as the chat template takes them: text content, tool-call arguments as objects (a string
    would be encoded twice)."""
    rendered = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        if role not in ROLES:
            raise APIError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param=f"{where}.role")
        entry: dict[str, Any] = {"role": role, "content": message_text(message.get("content"), f"{where}.content")}
        calls = []
        for call in message.get("tool_calls") or []:
            function = dict(call.get("function") or {})
            arguments = function.get("arguments", {})
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except json.JSONDecodeError as error:
                    raise APIError(400, f"{where}.tool_calls: arguments is not JSON ({error.msg})",
                                   param=f"{where}.tool_calls") from None
            calls.append({**call, "function": {**function, "arguments": arguments}})
        if calls:
            entry["tool_calls"] = calls
        rendered.append(entry)
    return rendered


def chat_prompt_ids(served: ServedModel, request: ChatCompletionRequest) -> list[int]:
    if not served.tokenizer.chat_template:
        raise APIError(400, f"the served tokenizer ({served.folder}) has no chat template; send the rendered prompt "
                            f"to /v1/completions", param="messages")
    # Fields the client left out stay out: the template renders the schema as the client wrote it.
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None
    try:
        text = served.tokenizer.apply_chat_template(template_messages(request.messages), tools=tools,
                                                    add_generation_prompt=True, tokenize=False)
    except APIError:
        raise
    except Exception as error:  # jinja raises its own types for a message the template refuses
        raise APIError(400, f"the chat template refused the messages: {error}", param="messages") from None
    return list(served.tokenizer.encode(text, add_special_tokens=False))


def message_of(request: ChatCompletionRequest, choice: Choice,
               parse: Callable[[str], ParsedTurn]) -> tuple[ChatMessage, str]:
    """The assistant message and finish reason of a choice: tool calls when tools were offered and the reply's
    calls parse."""
    if not request.tools or request.tool_choice == "none":
        return ChatMessage(content=choice.text), choice.finish_reason
    turn = parse(choice.text)
    calls = list(turn.calls)
    if isinstance(request.tool_choice, dict):
        wanted = (request.tool_choice.get("function") or {}).get("name")
        calls = [call for call in calls if call.name == wanted]
    if not calls:
        return ChatMessage(content=choice.text), choice.finish_reason
    tool_calls = [ChatToolCall(id=f"call_{uuid.uuid4().hex[:24]}",
                               function=ToolCallFunction(name=call.name, arguments=json.dumps(call.arguments)))
                  for call in calls]
    finish_reason = "tool_calls" if choice.finish_reason == "stop" else choice.finish_reason
    return ChatMessage(content=turn.content.strip() or None, tool_calls=tool_calls), finish_reason


def logprobs_of(served: ServedModel, request: ChatCompletionRequest, choice: Choice) -> ChatLogprobs | None:
    """Each sampled token's log-prob; top_logprobs holds the sampled token alone (the engine computes no other)."""
    if not request.logprobs:
        return None
    entries = []
    for text, log_prob in zip(token_texts(served.tokenizer, choice.token_ids), choice.log_probs):
        data = list(text.encode("utf-8"))
        tops = [TopLogprob(token=text, logprob=log_prob, bytes=data)] if (request.top_logprobs or 0) >= 1 else []
        entries.append(TokenLogprob(token=text, logprob=log_prob, bytes=data, top_logprobs=tops))
    return ChatLogprobs(content=entries)


async def create_chat_completion(served: ServedModel, metrics: ServerMetrics, request: ChatCompletionRequest,
                                 headers: Mapping[str, str],
                                 parse: Callable[[str], ParsedTurn]) -> ChatCompletionResponse | AsyncIterator[str]:
    prompt_ids = chat_prompt_ids(served, request)
    served.check_prompt(prompt_ids, "messages")
    budget_param = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    budget = served.budget(prompt_ids, request.token_budget(), budget_param)
    request_id = request.request_id or f"chatcmpl-{uuid.uuid4().hex}"
    choices = generate_choices(served, request, prompt_ids, budget, request_id, ROUTE, headers)
    created = int(time.time())
    if request.stream:
        return stream_chat(served, metrics, request, request_id, created, choices, parse)
    finished = sorted([choice async for choice in choices], key=lambda choice: choice.index)
    usage = usage_of(finished)
    metrics.observe_tokens(usage.prompt_tokens, usage.completion_tokens)
    results = []
    for choice in finished:
        message, finish_reason = message_of(request, choice, parse)
        results.append(ChatChoice(index=choice.index, message=message, finish_reason=finish_reason,
                                  logprobs=logprobs_of(served, request, choice),
                                  **choice.rl_fields(request.return_token_ids)))
    return ChatCompletionResponse(id=request_id, created=created, model=served.name, choices=results, usage=usage,
                                  weight_version=served.version)


async def stream_chat(served: ServedModel, metrics: ServerMetrics, request: ChatCompletionRequest, request_id: str,
                      created: int, choices: AsyncIterator[Choice],
                      parse: Callable[[str], ParsedTurn]) -> AsyncIterator[str]:
    """Per choice: the role, then the content token by token (or, when the reply called tools, its content and
    its calls in one event each), then the finish reason."""
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": served.name}

    def event(index: int, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> str:
        return sse({**head, "choices": [{"index": index, "delta": delta, "logprobs": None,
                                         "finish_reason": finish_reason, **extra}]})

    finished: list[Choice] = []
    async for choice in choices:
        finished.append(choice)
        message, finish_reason = message_of(request, choice, parse)
        yield event(choice.index, {"role": "assistant", "content": ""})
        if message.tool_calls:
            if message.content:
                yield event(choice.index, {"content": message.content})
            calls = [{"index": position, **call.model_dump()} for position, call in enumerate(message.tool_calls)]
            yield event(choice.index, {"tool_calls": calls})
        else:
            emitted = ""
            for count in range(1, len(choice.token_ids) + 1):
                text = served.tokenizer.decode(choice.token_ids[:count], skip_special_tokens=True)[:len(choice.text)]
                if len(text) > len(emitted):
                    yield event(choice.index, {"content": text[len(emitted):]})
                    emitted = text
        yield event(choice.index, {}, finish_reason, **choice.rl_fields(request.return_token_ids))
    usage = usage_of(finished)
    metrics.observe_tokens(usage.prompt_tokens, usage.completion_tokens)
    if request.stream_options is not None and request.stream_options.include_usage:
        yield sse({**head, "choices": [], "usage": usage.model_dump()})
    yield sse("[DONE]")
