"""`rollout.agent.*` checked before Ray starts: the file or module `rollout.agent.path` names exists and defines
the async function, read without running the user's code (the file is parsed, a module is only located), and
the agent runs alone (not with the built-in multi-turn loop, not with a greedy-baseline estimator).

    check_agent(config)      # ConfigError naming the key, the file and the function
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from asyncrl.algos import ADVANTAGE_ESTIMATORS
from asyncrl.config.errors import ConfigError
from asyncrl.config.schema import AsyncRLConfig
from asyncrl.config.user_code import split_spec

KEY = "rollout.agent.path"
AGENTS_EXTRA = "agents"
AGENTS_PACKAGES = ("openai", "fastapi", "uvicorn")   # the agents extra: the agent's client, the recording endpoint
HINT = "(write `async def rollout(client, sample)`; docs/byo-agent.md)"


def split_agent_path(path: str) -> tuple[str, str]:
    """('file.py' or 'package.module', 'function') of a `rollout.agent.path` value."""
    spec = split_spec(path)
    if spec is None or not spec.name.isidentifier():
        raise ConfigError(f"{KEY} must be 'file.py:function' or 'package.module:function', got {path!r}")
    return spec.location, spec.name


def check_agent_file(file: Path, name: str, path: str) -> None:
    if not file.is_file():
        raise ConfigError(f"{KEY}={path}: no file {file.resolve()}")
    try:
        tree = ast.parse(file.read_text(), str(file))
    except SyntaxError as error:
        raise ConfigError(f"{KEY}={path}: {file} does not parse: {error}") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            if isinstance(node, ast.FunctionDef):
                raise ConfigError(f"{KEY}={path}: {name!r} in {file} is not async {HINT}")
            return
    raise ConfigError(f"{KEY}={path}: {file} defines no async function {name!r} {HINT}")


def check_agent(config: AsyncRLConfig) -> None:
    path = config.rollout.agent.path
    if not path:
        return
    missing = [package for package in AGENTS_PACKAGES if importlib.util.find_spec(package) is None]
    if missing:
        raise ConfigError(f"{KEY} needs {', '.join(missing)} (not installed): "
                          f"pip install 'asyncrl[{AGENTS_EXTRA}]'")
    where, name = split_agent_path(path)
    if where.endswith(".py"):
        check_agent_file(Path(where), name, path)
    else:
        try:
            found = importlib.util.find_spec(where) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(f"{KEY}={path}: no module {where!r} on the Python path")
    if config.rollout.multi_turn.enable:
        raise ConfigError(f"{KEY} and rollout.multi_turn.enable=true are two agent loops for one rollout: your "
                          "agent calls its own tools; set rollout.multi_turn.enable=false")
    estimator = config.algorithm.adv_estimator
    if estimator in ADVANTAGE_ESTIMATORS and ADVANTAGE_ESTIMATORS.spec(estimator).needs_greedy_baseline:
        raise ConfigError(f"{KEY}: algorithm.adv_estimator={estimator} compares each response with a greedy one, "
                          "which an agent run does not make; use grpo, rloo or another estimator without a "
                          "greedy baseline")
