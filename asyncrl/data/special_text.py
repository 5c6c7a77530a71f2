"""The text of a tokenizer's special tokens inside prompt messages.

A row whose message contains "<|im_end|>" or the EOS token's text would, encoded as it is, give the model a
control token the chat template did not put there: an end of turn or of sequence in the middle of the prompt.
`data.special_tokens_in_content` decides: "error" refuses the row, naming it; "escape" encodes that text as
plain characters (what HF tokenizers' `split_special_tokens=True` does, here for the message text only, so the
template's own special tokens stay control tokens); "allow" keeps it a control token.

    special = SpecialText.of(tokenizer)                # None for a tokenizer without special tokens
    special.find(messages)                             # (message position, token text) or None
    special.encode_escaped(tokenizer, messages, render, "p.jsonl:3")
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from asyncrl.data.reader import DatasetError

SpecialTokensInContent = Literal["error", "escape", "allow"]
# Stands in for an escaped text while the chat template renders: private-use characters, which no template
# rewrites, so the escaped spans are found again in the rendered prompt.
PLACEHOLDER = "\ue000{}\ue001"
PLACEHOLDER_PATTERN = re.compile("\ue000(\\d+)\ue001")


@dataclass(frozen=True)
class SpecialText:
    pattern: re.Pattern[str]   # matches the text of any special token, longest first
    ids: frozenset[int]        # their token ids

    @classmethod
    def of(cls, tokenizer: Any) -> SpecialText | None:
        special = {token.content: index for index, token in tokenizer.added_tokens_decoder.items() if token.special}
        if not special:
            return None
        # Longest first, so that "<|im_end|>" is not read as a shorter token it starts with.
        alternatives = sorted(special, key=lambda text: (-len(text), text))
        return cls(re.compile("|".join(map(re.escape, alternatives))), frozenset(special.values()))

    def find(self, messages: list[dict[str, str]]) -> tuple[int, str] | None:
        """(position of the first message holding special-token text, that text), or None."""
        for position, message in enumerate(messages):
            match = self.pattern.search(message["content"])
            if match:
                return position, match.group()
        return None

    def encode_escaped(self, tokenizer: Any, messages: list[dict[str, str]],
                       render: Callable[[list[dict[str, str]]], str], where: str) -> list[int]:
        """Token ids of the prompt with every special-token text of the messages encoded as plain text: the
        template renders messages whose special texts are placeholders; the rendered text between placeholders
        is encoded as usual, each escaped text with `split_special_tokens=True`."""
        escaped: list[str] = []

        def to_placeholder(match: re.Match[str]) -> str:
            escaped.append(match.group())
            return PLACEHOLDER.format(len(escaped) - 1)

        stand_ins = [{**message, "content": self.pattern.sub(to_placeholder, message["content"])}
                     for message in messages]
        pieces = PLACEHOLDER_PATTERN.split(render(stand_ins))  # text, index, text, index, ..., text
        if pieces[1::2] != [str(index) for index in range(len(escaped))]:
            raise DatasetError(
                f"{where}: cannot escape the special-token text {escaped[0]!r}: the chat template does not render "
                "the message text as given; remove that text from the data, or set "
                "data.special_tokens_in_content=allow")
        ids: list[int] = []
        for position, piece in enumerate(pieces):
            if position % 2 == 0:
                ids.extend(tokenizer.encode(piece, add_special_tokens=False) if piece else [])
                continue
            plain = tokenizer.encode(escaped[int(piece)], add_special_tokens=False, split_special_tokens=True)
            if self.ids.intersection(plain):
                raise DatasetError(f"{where}: this tokenizer cannot encode {escaped[int(piece)]!r} as plain text; "
                                   "remove it from the data, or set data.special_tokens_in_content=allow")
            ids.extend(plain)
        return ids
