"""A server under check: its client and routes, the weights it should hold and a changed copy of them, and the
completions the checks ask for (token ids in, as the external backend sends them).

    under = ServerUnderCheck(server, api, reference, changed, CheckSettings())
    sample = under.complete(seed=3)                        # one completion of the check's prompt
    samples, error = under.complete_around(action, 100)   # a stream of them, `action` run while some are in flight
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import numpy as np

from asyncrl.rollout.external_answer import choice_log_probs
from asyncrl.rollout.external_client import ServerClient, ServerFailure, ServerRequestError
from asyncrl.rollout.readiness.reference import ReferenceModel
from asyncrl.rollout.server_api import AsyncrlServerApi, VllmServerApi

DEFAULT_PROMPT = "12+34=46. 7+8="
MAX_PROMPT_TOKENS = 16
MAX_RESPONSE_TOKENS = 48
STAGGER_REQUESTS = 48   # the completions of `complete_around`: about 12 in flight at a time over 4 request times


@dataclass(frozen=True)
class CheckSettings:
    temperature: float = 0.7      # the sampling temperature every completion asks for
    tolerance: float = 1e-3       # largest |server - asyncrl| log-prob difference that counts as equal (fp32)
    timeout_s: float = 60.0       # limit on each call to the server
    num_samples: int = 4          # completions per check that samples (seeds 0..n-1)
    prompt: str = DEFAULT_PROMPT  # text of the prompt (the model's tokenizer), special ids added inside


@dataclass
class Sample:
    """One completion as the server answered it, or the error it raised; nothing here is trusted."""
    seed: int
    ids: Any = None             # the choice's token_ids as answered
    log_probs: Any = None       # token_logprobs (or logprobs.token_logprobs) as answered
    prompt_echo: Any = None     # prompt_token_ids, where the server echoes them
    versions: Any = None        # token_versions, where the server stamps them
    finish_reason: Any = None
    error: str = ""
    seconds: float = 0.0        # from sending it to its answer

    def problem(self) -> str:
        """Why the ids and log-probs cannot be compared with the reference ("" when they can)."""
        if self.error:
            return self.error
        if not isinstance(self.ids, list) or not all(isinstance(i, int) for i in self.ids):
            return "token_ids is not a list of integers"
        if not isinstance(self.log_probs, list) or not all(isinstance(p, (int, float)) for p in self.log_probs):
            return "no list of log-probs"
        if len(self.ids) != len(self.log_probs):
            return f"{len(self.ids)} ids for {len(self.log_probs)} log-probs (see token_ids)"
        return ""

    def is_usable(self) -> bool:
        return not self.problem()


class ServerUnderCheck:
    def __init__(self, server: ServerClient, api: AsyncrlServerApi | VllmServerApi, reference: ReferenceModel,
                 changed: ReferenceModel, settings: CheckSettings):
        self.server, self.api, self.reference, self.changed, self.settings = server, api, reference, changed, settings
        text_ids = reference.encode(settings.prompt)[:MAX_PROMPT_TOKENS]
        # Special ids inside the prompt: a server that works on text (decodes, re-encodes) loses them.
        half = len(text_ids) // 2
        self.prompt = text_ids[:half] + reference.special_ids[:2] + text_ids[half:]
        self.max_tokens = min(MAX_RESPONSE_TOKENS, reference.max_model_len - len(self.prompt) - 1)
        self.samples: list[Sample] = []   # the first `num_samples` completions, on the weights of --model
        self.has_reloaded = False

    def body(self, seed: int, max_tokens: int) -> dict[str, Any]:
        return {"model": self.server.model, "prompt": self.prompt, "max_tokens": max_tokens,
                "temperature": self.settings.temperature, "top_p": 1.0, "seed": seed, "ignore_eos": True,
                "return_token_ids": True, "logprobs": 0, "request_id": f"check-{seed}-{time.monotonic_ns()}"}

    def complete(self, seed: int, max_tokens: int = 0) -> Sample:
        body = self.body(seed, max_tokens or self.max_tokens)
        started = time.monotonic()
        try:
            response = httpx.post(self.server.url + "/v1/completions", json=body, headers=self.server.headers,
                                  timeout=self.settings.timeout_s)
            answer = self.server.check(response, f"completion {body['request_id']}")
            choice = answer["choices"][0]
        except (httpx.HTTPError, ServerFailure, ServerRequestError, KeyError, IndexError, TypeError) as error:
            return Sample(seed, error=f"{type(error).__name__}: {error}")
        return Sample(seed, choice.get("token_ids"), choice_log_probs(choice), choice.get("prompt_token_ids"),
                      choice.get("token_versions"), choice.get("finish_reason"), seconds=time.monotonic() - started)

    def complete_around(self, action: Callable[[], None], first_seed: int) -> tuple[list[Sample], str]:
        """Completions sent one after another, a new one every twelfth of a request's own time, over a window of
        STAGGER_REQUESTS of them, and `action` run in the middle of the window: whenever it lands there, some
        requests are part way through (no guess at when a request starts or ends). Returns the samples and the
        action's error ("" when it succeeded)."""
        interval = self.request_seconds() / 12
        seeds = list(range(first_seed, first_seed + STAGGER_REQUESTS))
        error = ""
        with ThreadPoolExecutor(len(seeds)) as pool:
            pending = []
            for index, seed in enumerate(seeds):
                pending.append(pool.submit(self.complete, seed))
                if index == len(seeds) // 2:
                    try:
                        action()
                    except (ServerFailure, ServerRequestError) as failure:
                        error = str(failure)
                time.sleep(interval)
            return [future.result() for future in pending], error

    def request_seconds(self) -> float:
        """How long one completion of the check's prompt takes on its own: the fastest of the first samples (a
        shorter guess only puts more requests in flight at once)."""
        timed = [sample.seconds for sample in self.samples if not sample.error] or \
            [self.complete(seed).seconds for seed in range(self.settings.num_samples)]
        return min(timed)

    def reload(self, model: ReferenceModel, version: int) -> None:
        self.has_reloaded = True
        self.api.reload(self.server, str(model.folder), version, self.settings.timeout_s)

    def differences(self, sample: Sample, model: ReferenceModel) -> np.ndarray:
        """|server - `model`| per token of a usable sample (each token given the sampled ones before it)."""
        expected = model.log_probs(self.prompt, sample.ids, self.settings.temperature)
        return np.abs(np.asarray(sample.log_probs, np.float64) - expected)
