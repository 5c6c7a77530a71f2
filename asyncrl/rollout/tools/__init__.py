"""Tools an agent may call (docs/agents.md): the protocol, the built-ins, the sandbox, the YAML, the executor.

    base.py          Tool (async call -> text), ToolError / ToolTimeout, FunctionTool (user callables), TOOLS
    calculator.py    "calculator": exact arithmetic from the syntax tree
    python_tool.py   "python": code in the sandbox
    sandbox.py       run_python: a subprocess with wall/CPU/memory/output/process limits, no network, its own dir
    isolation.py     the OS layer of the sandbox: bubblewrap (read-only root, own namespaces, nothing outlives a call)
    latency.py       simulated per-call latency (benchmarks)
    config.py        load_tools(rollout.multi_turn.tool_config_path)
    executor.py      ToolExecutor: a turn's calls, concurrently, each under its timeout
"""

from asyncrl.rollout.tools import calculator, python_tool  # noqa: F401  (registers the built-ins)
from asyncrl.rollout.tools.base import TOOLS, CallContext, FunctionTool, Tool, ToolError, ToolSpec, ToolTimeout
from asyncrl.rollout.tools.config import ToolConfigError, load_tools
from asyncrl.rollout.tools.executor import ToolExecutor
from asyncrl.rollout.tools.latency import LatencyDistribution
from asyncrl.rollout.tools.sandbox import SandboxLimits, SandboxRun, run_python

__all__ = [
    "TOOLS",
    "CallContext",
    "FunctionTool",
    "LatencyDistribution",
    "SandboxLimits",
    "SandboxRun",
    "Tool",
    "ToolConfigError",
    "ToolError",
    "ToolExecutor",
    "ToolSpec",
    "ToolTimeout",
    "load_tools",
    "run_python",
]
