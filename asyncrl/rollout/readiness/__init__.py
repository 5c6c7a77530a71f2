"""`asyncrl check-server URL --model PATH`: is an OpenAI-compatible server fit to be a rollout server for RL? Each
check of `checks.py` passes or fails with its evidence: token ids out, log-probs of the requested temperature,
reproducible seeds, abort, a reload that changes the weights, the checksum after it, requests during a reload.

    report = check_server("http://127.0.0.1:8001", "path/to/model", api="asyncrl", work_dir=tmp)
    print(report.table()); report.passed; report.failed_names()

`--model` is the HF folder whose weights the server holds (its log-probs are recomputed here by asyncrl's own
transformer). The reload checks load a changed copy of it (written under `work_dir`, which the server must be able
to read) and then the original back, stamped version 0: the server ends on the weights it started with. Run it
before a run, not against a server another run is training on.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from asyncrl.rollout.external_client import ServerClient, ServerFailure, ServerRequestError, api_key_of
from asyncrl.rollout.readiness.checks import ORIGINAL_VERSION, SERVER_CHECKS, CheckResult
from asyncrl.rollout.readiness.probe import CheckSettings, ServerUnderCheck
from asyncrl.rollout.readiness.reference import ReferenceModel
from asyncrl.rollout.server_api import SERVER_APIS

__all__ = ["CheckResult", "CheckSettings", "ServerReport", "check_server", "main"]


@dataclass
class ServerReport:
    url: str
    results: list[CheckResult]

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.results)

    def failed_names(self) -> list[str]:
        return [result.name for result in self.results if not result.passed]

    def table(self) -> str:
        width = max(len(result.name) for result in self.results)
        lines = [f"{self.url}: {sum(r.passed for r in self.results)} of {len(self.results)} checks passed"]
        lines += [f"  {'PASS' if r.passed else 'FAIL'}  {r.name:<{width}}  {r.evidence}" for r in self.results]
        return "\n".join(lines)


def check_server(url: str, model: str | Path, api: str = "asyncrl", work_dir: str | Path | None = None,
                 settings: CheckSettings = CheckSettings(), api_key: str = "",
                 reload_endpoint: str = "/update_weights_from_disk") -> ServerReport:
    """Every check against the server at `url`, which holds the weights of `model`; the server is left on them."""
    server = ServerClient(url, api_key, settings.timeout_s)
    server.connect()
    reference = ReferenceModel(model)
    with tempfile.TemporaryDirectory(prefix="asyncrl-check-", dir=work_dir) as scratch:
        changed = reference.perturbed(Path(scratch) / "changed", seed=0)
        under = ServerUnderCheck(server, SERVER_APIS[api](reload_endpoint), reference, changed, settings)
        try:
            results = [SERVER_CHECKS[name](under) for name in SERVER_CHECKS]
        finally:
            if under.has_reloaded:   # the original weights back, whatever the checks left
                under.reload(reference, ORIGINAL_VERSION)
    return ServerReport(url, results)


def main(options: argparse.Namespace) -> int:
    settings = CheckSettings(temperature=options.temperature, tolerance=options.tolerance,
                             timeout_s=options.timeout_s, prompt=options.prompt)
    try:
        report = check_server(options.url, options.model, options.api, options.work_dir, settings,
                              api_key_of(options.api_key_env), options.reload_endpoint)
    except (ServerFailure, ServerRequestError) as error:
        print(f"error: {error}")
        return 2
    print(report.table())
    if options.json:
        Path(options.json).write_text(json.dumps({"url": report.url, "passed": report.passed,
                                                  "checks": [asdict(result) for result in report.results]}, indent=1))
    return 0 if report.passed else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = CheckSettings()
    parser.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8001")
    parser.add_argument("--model", required=True, help="HF folder of the weights the server holds")
    parser.add_argument("--api", choices=sorted(SERVER_APIS), default="asyncrl",
                        help="the server's reload/checksum/abort routes (rollout.external.api)")
    parser.add_argument("--reload-endpoint", default="/update_weights_from_disk", help="with --api asyncrl")
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--tolerance", type=float, default=defaults.tolerance,
                        help="largest log-prob difference counted as equal (fp32; a bf16 server needs ~5e-2)")
    parser.add_argument("--timeout-s", type=float, default=defaults.timeout_s, help="limit on each call")
    parser.add_argument("--prompt", default=defaults.prompt, help="text of the prompt the checks complete")
    parser.add_argument("--work-dir", default=None, help="where the changed copy of the model is written (the "
                        "server must read it; default: the system's temporary folder)")
    parser.add_argument("--api-key-env", default="ASYNCRL_API_KEY", help="environment variable holding the key")
    parser.add_argument("--json", default=None, help="also write the report as JSON to this file")
