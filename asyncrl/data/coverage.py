"""How much of the prompts' text a tokenizer cannot represent.

A character outside a tokenizer's vocabulary becomes its unknown token, or, in a tokenizer without one,
vanishes: the model is then trained on prompts that differ from the dataset, and nothing fails. The character
tokenizer of the tiny models, for one, knows printable ASCII, tab and newline only.

    coverage = measure_coverage(tokenizer, records)
    coverage.lost_fraction        # 0.031: 3.1% of the characters of the messages do not survive
    coverage.describe()           # 'p.jsonl:3 loses 'é' x2 in 'héllo wörld''

Measured by an encode -> decode round trip of every message's text, in one batch. Unknown tokens are left out
of the decoded text, so whatever they stood for counts as lost; lost characters are the multiset difference of
the text and its round trip, which ignores what a tokenizer adds (a SentencePiece prefix space).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from asyncrl.data.records import PromptRecord


@dataclass(frozen=True)
class Coverage:
    num_chars: int              # characters of the messages' text, every message of every prompt
    num_lost_chars: int         # of them, those the encode -> decode round trip does not give back
    num_prompts_affected: int   # prompts that lose at least one character
    num_prompts: int
    example_prompt_id: str      # the first prompt that loses a character ("" when none does)
    example_lost: Counter[str]  # its lost characters, with counts
    example_text: str           # the message text they were lost from

    @property
    def lost_fraction(self) -> float:
        return self.num_lost_chars / self.num_chars if self.num_chars else 0.0

    def describe(self) -> str:
        lost = ", ".join(f"{character!r} x{count}" for character, count in self.example_lost.most_common(5))
        return f"{self.example_prompt_id} loses {lost} in {self.example_text[:80]!r}"


def measure_coverage(tokenizer: Any, records: list[PromptRecord]) -> Coverage:
    owners = [record.prompt_id for record in records for _ in record.messages]
    texts = [message["content"] for record in records for message in record.messages]
    if not texts:
        return Coverage(0, 0, 0, len(records), "", Counter(), "")
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    unknown_id = tokenizer.unk_token_id
    # Cleaning up spaces is a decoding choice, not what the model sees; keep the decoded text as encoded.
    decoded = tokenizer.batch_decode([[token for token in ids if token != unknown_id] for ids in encoded],
                                     skip_special_tokens=False, clean_up_tokenization_spaces=False)
    num_lost, affected, example = 0, set(), None
    for owner, text, round_trip in zip(owners, texts, decoded):
        if round_trip == text:
            continue
        lost = Counter(text) - Counter(round_trip)
        if not lost:
            continue
        num_lost += sum(lost.values())
        affected.add(owner)
        example = example or (owner, lost, text)
    example_id, example_lost, example_text = example or ("", Counter(), "")
    return Coverage(sum(map(len, texts)), num_lost, len(affected), len(records), example_id, example_lost,
                    example_text)
