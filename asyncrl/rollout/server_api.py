"""The routes beyond OpenAI's that RL needs of a rollout server, for each kind of server: reload the weights from
an HF folder, report their checksum, abort every request in flight. The external backend and `asyncrl
check-server` talk to a server through one of these (`rollout.external.api`).

    api = SERVER_APIS["vllm"]("/update_weights_from_disk")
    api.check(server)                                  # at the start: the routes are there, log-probs are usable
    api.reload(server, folder, version=3, timeout_s=120)
    api.checksum(server, timeout_s=60)                 # WeightsChecksum(sha256, dtype)
    api.abort_all(server, timeout_s=5)                 # the aborted completions return, finish_reason "abort"

`asyncrl`: `asyncrl serve`, with SGLang's route names: POST <reload_endpoint> {model_path, weight_version},
GET /weights_checksum, POST /abort_request {abort_all}.

`vllm`: vLLM's OpenAI server (`vllm serve`) in its development mode (`VLLM_SERVER_DEV_MODE=1`, which adds
/collective_rpc, /abort_requests, /reset_prefix_cache and /update_weight_version) with asyncrl's worker extension
(`--worker-extension-cls asyncrl.rollout.vllm.worker_extension.WeightSyncExtension`) and the log-probs of the
sampling distribution (`--logprobs-mode processed_logprobs`). A reload pauses the engine with its requests kept,
calls the extension's `asyncrl_load_folder` on every worker, empties the prefix cache (its keys and values were
computed by the old weights; the requests running recompute theirs), records the version and resumes: a request
in flight samples its tokens up to the reload from the old weights and the rest from the new ones alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.external_client import ServerClient, ServerFailure, ServerLied, ServerRequestError

VLLM_EXTENSION = "asyncrl.rollout.vllm.worker_extension.WeightSyncExtension"
VLLM_FLAGS = (f"VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --worker-extension-cls {VLLM_EXTENSION} "
              f"--logprobs-mode processed_logprobs")


@dataclass(frozen=True)
class WeightsChecksum:
    sha256: str   # `external_weights.weights_checksum` of the served weights
    dtype: str    # the dtype the server holds them in ("float32", "bfloat16")


def checksum_of(answer: Any, where: str) -> WeightsChecksum:
    if not isinstance(answer, dict) or not isinstance(answer.get("sha256"), str) or \
            not isinstance(answer.get("dtype"), str):
        raise ServerLied(f"{where}: the checksum answer lacks sha256 and dtype strings ({str(answer)[:200]})")
    return WeightsChecksum(answer["sha256"], answer["dtype"])


class AsyncrlServerApi:
    """`asyncrl serve` (and SGLang's route names)."""

    def __init__(self, reload_endpoint: str):
        self.reload_endpoint = reload_endpoint

    def check(self, server: ServerClient) -> None:
        """Nothing beyond /health and /v1/models (`ServerClient.connect`)."""

    def reload(self, server: ServerClient, folder: str, version: int, timeout_s: float) -> None:
        server.post(self.reload_endpoint, {"model_path": folder, "weight_version": version}, timeout_s)

    def checksum(self, server: ServerClient, timeout_s: float) -> WeightsChecksum:
        return checksum_of(server.get("/weights_checksum", timeout_s), f"{server.url}: GET /weights_checksum")

    def abort_all(self, server: ServerClient, timeout_s: float) -> None:
        server.post("/abort_request", {"abort_all": True}, timeout_s)


class VllmServerApi:
    """vLLM's OpenAI server in development mode with asyncrl's worker extension."""

    def __init__(self, reload_endpoint: str):
        del reload_endpoint   # the reload is a call of the worker extension

    def rpc(self, server: ServerClient, method: str, args: list[str], timeout_s: float | None = None) -> list[Any]:
        """The answers of every vLLM worker to the extension's `method`."""
        where = f"{server.url}: POST /collective_rpc {method}"
        try:
            answer = server.post("/collective_rpc", {"method": method, "args": args}, timeout_s)
        except ServerRequestError as error:
            if "404" in str(error):
                raise ServerRequestError(f"{server.url} has no POST /collective_rpc: start vLLM in its development "
                                         f"mode ({VLLM_FLAGS})") from None
            raise
        except ServerFailure as error:
            if "has no attribute" in str(error) or "not found" in str(error).lower():
                raise ServerRequestError(f"{where}: the vLLM workers lack asyncrl's worker extension: start vLLM "
                                         f"with --worker-extension-cls {VLLM_EXTENSION} ({error})") from None
            raise
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or not results:
            raise ServerLied(f"{where}: no results list in the answer ({str(answer)[:200]})")
        return results

    def check(self, server: ServerClient) -> None:
        facts = self.rpc(server, "asyncrl_server_facts", [])[0]
        mode = facts.get("logprobs_mode") if isinstance(facts, dict) else None
        if mode != "processed_logprobs":
            raise ServerRequestError(f"{server.url}: vLLM reports log-probs in mode {mode!r}, not those of the "
                                     f"distribution it samples from (temperature applied): start it with "
                                     f"--logprobs-mode processed_logprobs")

    def reload(self, server: ServerClient, folder: str, version: int, timeout_s: float) -> None:
        """Between two engine steps (paused, requests kept): load, empty the cache, stamp the version."""
        server.post("/pause?mode=keep", {}, timeout_s)
        try:
            self.rpc(server, "asyncrl_load_folder", [folder], timeout_s)
            emptied = server.post("/reset_prefix_cache?reset_running_requests=true", {}, timeout_s)
            if not isinstance(emptied, dict) or emptied.get("success") is not True:
                raise ServerFailure(f"{server.url}: POST /reset_prefix_cache after the reload of {folder} did not "
                                    f"succeed ({str(emptied)[:200]}): its cached prefixes hold the old weights' keys")
            server.post("/update_weight_version", {"new_version": str(version)}, timeout_s)
        finally:
            server.post("/resume", {}, timeout_s)

    def checksum(self, server: ServerClient, timeout_s: float) -> WeightsChecksum:
        where = f"{server.url}: POST /collective_rpc asyncrl_weights_checksum"
        checksums = {checksum_of(answer, where) for answer in self.rpc(server, "asyncrl_weights_checksum", [],
                                                                       timeout_s)}
        if len(checksums) != 1:
            raise ServerLied(f"{where}: its workers hold different weights ({sorted(checksums)})")
        return checksums.pop()

    def abort_all(self, server: ServerClient, timeout_s: float) -> None:
        server.post("/abort_requests", {}, timeout_s)


SERVER_APIS: dict[str, type[AsyncrlServerApi] | type[VllmServerApi]] = {"asyncrl": AsyncrlServerApi,
                                                                       "vllm": VllmServerApi}
