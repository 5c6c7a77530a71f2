"""Turn prompts into engine requests with deterministic per-request seeds.

A request's seed depends only on (rollout.seed, the prompt id, the sample index, a salt such as the
step), never on batch composition or timing, so a resumed run regenerates exactly what the
interrupted one would have.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Optional, Sequence

from asyncrl.core.lengths import LengthDistribution
from asyncrl.data.records import TokenizedPrompt
from asyncrl.engine import GenerationRequest, SamplingParams


def request_seed(base_seed: int, prompt_id: str, sample_index: int, salt: str) -> int:
    digest = hashlib.blake2b(f"{base_seed}|{prompt_id}|{sample_index}|{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # < 2**63


def request_params(params: SamplingParams, seed: int, lengths: Optional[LengthDistribution]) -> SamplingParams:
    """The request's own params: its seed, and its token budget when a length distribution is set."""
    if lengths is None:
        return replace(params, seed=seed)
    return replace(params, seed=seed, max_new_tokens=min(params.max_new_tokens, lengths.for_seed(seed)))


def make_requests(prompts: Sequence[TokenizedPrompt], num_samples: int, params: SamplingParams, base_seed: int,
                  salts: str | Sequence[str], lengths: Optional[LengthDistribution] = None) -> list[GenerationRequest]:
    """num_samples requests per prompt, grouped: prompt 0's samples first. `salts` is one per prompt (or one
    for all), e.g. "epoch0": the same prompt in the same epoch draws the same numbers in every mode, so
    modes can be compared sample for sample. Ids are '<salt>/<prompt id>/<k>'. `lengths` draws each
    request's token budget from its seed (benchmark workloads), capped at `params.max_new_tokens`."""
    salts = [salts] * len(prompts) if isinstance(salts, str) else list(salts)
    requests = []
    for prompt, salt in zip(prompts, salts):
        for sample_index in range(num_samples):
            seed = request_seed(base_seed, prompt.record.prompt_id, sample_index, salt)
            requests.append(GenerationRequest(f"{salt}/{prompt.record.prompt_id}/{sample_index}",
                                              prompt.prompt_ids, request_params(params, seed, lengths)))
    return requests
