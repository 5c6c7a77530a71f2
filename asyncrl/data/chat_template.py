"""Turn chat messages into the prompt the model sees: text through the tokenizer's chat template, then token ids.

    encoder = PromptEncoder(tokenizer)                         # once per dataset
    encoder.encode([{"role": "user", "content": "2+3="}])      # ids of '<|user|>2+3=<|assistant|>'

A tokenizer without a chat template is an error naming its folder unless `chat_template_fallback="plain"` asks
for "user: ...\\nassistant: " lines: a silent fallback makes prompts longer and unlike anything the model was
trained on, and its first visible symptom was a dataset whose prompts were all dropped as too long.
The text of a special token inside a message (`<|im_end|>`, the EOS text) is refused, escaped or kept, as
`special_tokens_in_content` says (`asyncrl.data.special_text`).
"""

from __future__ import annotations

from typing import Any, Literal

from asyncrl.data.reader import DatasetError
from asyncrl.data.special_text import SpecialText, SpecialTokensInContent

ChatTemplateFallback = Literal["error", "plain"]


class PromptEncoder:
    """Messages -> prompt token ids, for one tokenizer and one set of choices. Built once per dataset: reading
    a tokenizer's special tokens costs more than encoding a short prompt."""

    def __init__(self, tokenizer: Any, apply_chat_template: bool = True,
                 chat_template_fallback: ChatTemplateFallback = "error",
                 special_tokens_in_content: SpecialTokensInContent = "error"):
        check_chat_template(tokenizer, apply_chat_template, chat_template_fallback)
        self.tokenizer = tokenizer
        self.apply_chat_template = apply_chat_template
        self.chat_template_fallback = chat_template_fallback
        self.special_tokens_in_content = special_tokens_in_content
        self.special = SpecialText.of(tokenizer) if special_tokens_in_content != "allow" else None

    def render(self, messages: list[dict[str, str]]) -> str:
        return render_prompt(self.tokenizer, messages, self.apply_chat_template, self.chat_template_fallback)

    def encode(self, messages: list[dict[str, str]], where: str = "prompt") -> list[int]:
        """Token ids of the rendered prompt; `where` names the row in errors ("p.jsonl:3")."""
        found = self.special.find(messages) if self.special is not None else None
        if found is None:
            # The template already placed any special tokens; adding BOS again would change the prompt.
            return list(self.tokenizer.encode(self.render(messages), add_special_tokens=False))
        if self.special_tokens_in_content == "escape":
            return self.special.encode_escaped(self.tokenizer, messages, self.render, where)
        position, token = found
        raise DatasetError(
            f"{where}: message {position} ({messages[position]['role']}) contains {token!r}, the text of a special "
            "token of the tokenizer, which would be encoded as that control token (an injected end of turn or of "
            "sequence); set data.special_tokens_in_content=escape to encode it as plain text, or =allow to keep it "
            "a control token")


def check_chat_template(tokenizer: Any, apply_chat_template: bool = True,
                        chat_template_fallback: ChatTemplateFallback = "error") -> None:
    """Raises DatasetError naming the tokenizer's folder when a template is needed and missing and no fallback
    was chosen."""
    if apply_chat_template and not tokenizer.chat_template and chat_template_fallback == "error":
        raise DatasetError(
            f"tokenizer {tokenizer.name_or_path} has no chat template (no chat_template in its "
            "tokenizer_config.json, no chat_template.jinja): copy the template of the model's release into the "
            "folder, set data.chat_template_fallback=plain to format prompts as 'user: ...' lines, or "
            "data.apply_chat_template=false to join the messages' text")


def render_prompt(tokenizer: Any, messages: list[dict[str, str]], apply_chat_template: bool = True,
                  chat_template_fallback: ChatTemplateFallback = "error") -> str:
    """The prompt text, ending where the assistant's answer starts."""
    if not apply_chat_template:
        return "\n".join(message["content"] for message in messages)
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    check_chat_template(tokenizer, apply_chat_template, chat_template_fallback)
    return plain_template(messages)


def plain_template(messages: list[dict[str, str]]) -> str:
    lines = [f"{message['role']}: {message['content']}" for message in messages]
    return "\n".join(lines) + "\nassistant: "


def encode_prompt(tokenizer: Any, messages: list[dict[str, str]], apply_chat_template: bool = True,
                  chat_template_fallback: ChatTemplateFallback = "error",
                  special_tokens_in_content: SpecialTokensInContent = "error", where: str = "prompt") -> list[int]:
    """One prompt's ids; for many, build a PromptEncoder once."""
    encoder = PromptEncoder(tokenizer, apply_chat_template, chat_template_fallback, special_tokens_in_content)
    return encoder.encode(messages, where)
