"""Turn chat messages into the prompt text the model sees.

The tokenizer's own chat template is used when it has one; otherwise a plain default
("user: ...\\nassistant: ") so tokenizers without a template still work.
"""

from __future__ import annotations

from typing import Any


def render_prompt(tokenizer: Any, messages: list[dict[str, str]], apply_chat_template: bool = True) -> str:
    """The prompt text, ending where the assistant's answer starts."""
    if not apply_chat_template:
        return "\n".join(message["content"] for message in messages)
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return plain_template(messages)


def plain_template(messages: list[dict[str, str]]) -> str:
    lines = [f"{message['role']}: {message['content']}" for message in messages]
    return "\n".join(lines) + "\nassistant: "


def encode_prompt(tokenizer: Any, messages: list[dict[str, str]], apply_chat_template: bool = True) -> list[int]:
    text = render_prompt(tokenizer, messages, apply_chat_template)
    # The template already placed any special tokens; adding BOS again would change the prompt.
    return list(tokenizer.encode(text, add_special_tokens=False))
