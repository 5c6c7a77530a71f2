"""The chat template as a bridge for environment tokens: only the tool turns are rendered, never the model's.

    renderer = ToolTurnRenderer(tokenizer, tools=schemas)
    ids = renderer.render([{"role": "tool", "content": "408"}])
    # tiny template: '<|user|><tool_response>408</tool_response><|assistant|>' as ids
    # Qwen2.5:       '\\n<|im_start|>user\\n<tool_response>\\n408\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n'

The model's turn ends with the EOS token it sampled; what the template puts after it (a newline in ChatML,
which the model never samples), the tool results and the next generation prompt are the environment's
tokens. They are found by rendering a dummy conversation with and without the tool messages and cutting the
longer render right after the assistant turn's EOS text, so the template's own markup is kept exactly and
no default system prompt is dragged in.
"""

from __future__ import annotations

from typing import Any, Literal

DUMMY_USER = {"role": "user", "content": "u"}
DUMMY_ASSISTANT = {"role": "assistant", "content": "a"}


class TemplateError(ValueError):
    """The tokenizer's chat template cannot render tool turns for multi-turn rollouts (names the tokenizer)."""


class ToolTurnRenderer:
    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None):
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.eos_text = tokenizer.eos_token
        base = self.render_text([DUMMY_USER, DUMMY_ASSISTANT], add_generation_prompt=False)
        cut = base.rfind(self.eos_text) if self.eos_text else -1
        if cut < 0:
            raise TemplateError(
                f"the chat template of tokenizer {tokenizer.name_or_path} does not end an assistant turn with the "
                f"EOS token {self.eos_text!r}, so the end of the model's turn cannot be found in a render; "
                "rollout.multi_turn needs a template that does (ChatML, Qwen2.5, the tiny models' template)")
        self.base = base
        self.cut = cut + len(self.eos_text)
        self.render([{"role": "tool", "content": "x"}])   # fails now, naming the tokenizer, if the role is missing

    def render_text(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt)
        except Exception as error:   # jinja raises its own types, e.g. for an unknown role
            raise TemplateError(f"the chat template of tokenizer {self.tokenizer.name_or_path} cannot render "
                                f"{[message['role'] for message in messages]}: {error}") from None

    def render(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """Ids of what follows the model's EOS: the tool turn(s) and the next assistant prompt."""
        full = self.render_text([DUMMY_USER, DUMMY_ASSISTANT, *tool_messages], add_generation_prompt=True)
        if not full.startswith(self.base[:self.cut]):
            raise TemplateError(f"the chat template of tokenizer {self.tokenizer.name_or_path} changes earlier turns "
                                "when tool messages follow them (not prefix-preserving); multi-turn rollouts need "
                                "one that keeps them")
        return list(self.tokenizer.encode(full[self.cut:], add_special_tokens=False))


def truncate_tokens(ids: list[int], limit: int, side: Literal["left", "right", "middle"]) -> list[int]:
    """At most `limit` ids: left keeps the end, right the start, middle both ends."""
    if len(ids) <= limit:
        return ids
    if side == "left":
        return ids[len(ids) - limit:]
    if side == "right":
        return ids[:limit]
    head = (limit + 1) // 2
    return ids[:head] + ids[len(ids) - (limit - head):]
