"""The wire format of `asyncrl serve`: OpenAI's request and response bodies as pydantic models, the fields vLLM
and SGLang add for RL (token ids in and out, per-token log-probs and policy versions), and OpenAI-style errors.

    request = CompletionRequest.model_validate(body)     # 422 naming the field when a value is out of range
    raise APIError(404, "model 'gpt-5' is not served here; GET /v1/models lists ...", param="model",
                   code="model_not_found")                # -> {"error": {"message", "type", "param", "code"}}

Fields a client sends that are not listed here are ignored, as OpenAI and vLLM do (clients send optional keys
such as `user` or `frequency_penalty` at their defaults).
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, model_validator

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               413: "invalid_request_error", 422: "invalid_request_error", 503: "server_error"}


class APIError(Exception):
    """An OpenAI-style error: the HTTP status and the body's message, type, param and code."""

    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: Optional[str] = None, code: Optional[str] = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": param,
                      "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """What completions and chat share: OpenAI's sampling fields and vLLM's extensions (`top_k`, `ignore_eos`,
    `stop_token_ids`, `return_token_ids`, `request_id`). A seed makes a choice reproducible: choice i of a
    request with seed s is sampled with seed s + i, exactly as the engine samples a request with that seed."""

    model: str
    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    max_tokens: Optional[int] = Field(None, ge=1)
    stop: Union[str, list[str], None] = None
    seed: Optional[int] = Field(None, ge=0, lt=2**63 - 128)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    return_token_ids: bool = False   # vLLM: prompt_token_ids and token_ids (+ asyncrl's log-probs, versions)
    request_id: Optional[str] = Field(None, min_length=1, max_length=200)   # the id POST /abort_request takes

    @model_validator(mode="after")
    def top_k_is_positive_or_off(self) -> "SamplingFields":
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (off) or positive, got 0")
        return self

    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(SamplingFields):
    """POST /v1/completions. `prompt` is text or token ids (one prompt; a list of several is refused)."""

    prompt: Union[str, list[int], list[str], list[list[int]]]
    max_tokens: Optional[int] = Field(16, ge=1)
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    echo: bool = False
    return_tokens_as_token_ids: bool = False   # vLLM: logprobs' tokens written "token_id:<id>"


class ChatFunction(BaseModel):
    name: str
    description: Optional[str] = None
    parameters: dict[str, Any] = Field(default_factory=dict)


class ChatTool(BaseModel):
    type: Literal["function"] = "function"
    function: ChatFunction


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions. Messages are OpenAI's (system, user, assistant with `tool_calls`, tool)."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[list[ChatTool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None

    def token_budget(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ---- responses -------------------------------------------------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class RLFields(BaseModel):
    """What RL needs of a choice, sent when the request sets `return_token_ids` (vLLM's names for the ids)."""

    prompt_token_ids: Optional[list[int]] = None
    token_ids: Optional[list[int]] = None            # the sampled ids, exactly (never re-tokenized text)
    token_logprobs: Optional[list[float]] = None     # each sampled token's log-prob (temperature-scaled)
    token_versions: Optional[list[int]] = None       # the policy version that sampled each token


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(RLFields):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None
    weight_version: int                              # SGLang's name: the policy version serving now


class ToolCallFunction(BaseModel):
    name: str
    arguments: str                                   # a JSON object, as text (OpenAI's format)


class ChatToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None
    tool_calls: list[ChatToolCall] = Field(default_factory=list)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ChatChoice(RLFields):
    index: int
    message: ChatMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Optional[Usage] = None
    weight_version: int


# ---- admin -------------------------------------------------------------------------------------------------
class ReloadRequest(BaseModel):
    """POST /update_weights_from_disk (SGLang's route and field names)."""

    model_path: str = Field(min_length=1)
    weight_version: Optional[int] = Field(None, ge=0, lt=2**31)   # None: the current version + 1


class AbortRequest(BaseModel):
    """POST /abort_request (SGLang's names): one request by id, or every request in flight."""

    rid: Optional[str] = None
    abort_all: bool = False

    @model_validator(mode="after")
    def names_what_to_abort(self) -> "AbortRequest":
        if self.rid is None and not self.abort_all:
            raise ValueError("give rid (a request_id) or abort_all=true")
        return self
