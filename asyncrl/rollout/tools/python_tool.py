"""The code interpreter tool: runs the model's Python in the sandbox (`sandbox.py`) and returns what it printed.

    {"name": "python", "arguments": {"code": "print(sum(range(10)))"}}   ->   "45\\n"

Config keys (the tool's `config` in the tool YAML): wall_s, cpu_s, memory_mb, file_size_mb, max_processes,
max_output_bytes (`SandboxLimits`), and unsafe_without_os_isolation (default false). A run that fails, is killed
or prints too much raises a ToolError whose message (the end of its stderr, or which limit stopped it) is what
the model reads.

The code runs in a bubblewrap sandbox (`sandbox.py`, `isolation.py`). Where that cannot start, building the
tool fails (before Ray: the run's pre-flight builds the tools) naming what is missing and how to install it;
`unsafe_without_os_isolation: true` runs the code under the audit hook and limits only, which code that sets
out to escape gets around (docs/security.md).
"""

from __future__ import annotations

import logging
from typing import Any

from asyncrl.rollout.tools.base import CallContext, Tool, ToolError, ToolTimeout, TOOLS, function_schema
from asyncrl.rollout.tools.isolation import isolation_problem
from asyncrl.rollout.tools.sandbox import SandboxLimits, run_python

logger = logging.getLogger(__name__)

STDERR_TAIL_CHARS = 600
UNSAFE_KEY = "unsafe_without_os_isolation"


class PythonTool(Tool):
    def __init__(self, name: str, config: dict[str, Any], schema: dict[str, Any], timeout_s: float | None):
        self.name, self.schema = name, schema
        limits = dict(config)
        unsafe = limits.pop(UNSAFE_KEY, False)
        if not isinstance(unsafe, bool):
            raise ValueError(f"python tool: {UNSAFE_KEY} must be true or false, got {unsafe!r}")
        try:
            self.limits = SandboxLimits(**limits)
        except TypeError:
            valid = [*SandboxLimits.__dataclass_fields__, UNSAFE_KEY, "timeout_s", "latency"]
            raise ValueError(f"python tool: unknown config keys among {sorted(config)}; valid: {valid}") from None
        self.isolated = not unsafe
        if unsafe:
            logger.warning("python tool %r: %s: true, its code runs without OS isolation (audit hook and limits "
                           "only; code written to escape gets out: docs/security.md)", name, UNSAFE_KEY)
        problem = isolation_problem() if self.isolated else None
        if problem is not None:
            raise ValueError(f"python tool: tool code runs under OS isolation, which cannot start here: {problem}. "
                             f"To run it under the audit hook only (not a security boundary: docs/security.md), "
                             f"set {UNSAFE_KEY}: true in this tool's config")
        # The executor's limit sits above the sandbox's own, which stops the process first.
        self.timeout_s = timeout_s if timeout_s is not None else self.limits.wall_s + 5.0

    async def call(self, arguments: dict[str, Any], context: CallContext) -> str:
        code = arguments.get("code")
        if not isinstance(code, str) or set(arguments) != {"code"}:
            raise ToolError(f"{self.name} takes one string argument, 'code'; got {sorted(arguments)}")
        run = await run_python(code, self.limits, self.isolated)
        if run.timed_out:
            raise ToolTimeout(f"the code ran past {self.limits.wall_s:g} s and was stopped")
        if run.output_truncated:
            raise ToolError(f"the code printed more than {self.limits.max_output_bytes} bytes and was stopped; "
                            f"its output began: {run.stdout[:200]!r}")
        if run.exit_code < 0:
            raise ToolError(f"the code was killed by signal {-run.exit_code} (a CPU-time or memory limit)"
                            + tail(run.stderr))
        if run.exit_code != 0:
            raise ToolError(f"the code failed (exit code {run.exit_code})" + tail(run.stderr))
        return run.stdout


def tail(stderr: str) -> str:
    return f": {stderr[-STDERR_TAIL_CHARS:].strip()}" if stderr.strip() else ""


TOOLS.register("python", runs="in a sandboxed subprocess",
               schema=function_schema("python", "run Python code and return what it prints",
                                      {"code": "the program; print the result"}),
               summary="a Python interpreter in a bubblewrap sandbox (read-only system, its own writable directory, "
                       "own PID and network namespaces; wall, CPU, memory, output, process limits)")(PythonTool)
