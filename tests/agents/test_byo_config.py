"""`rollout.agent.*` is checked when the config loads, before Ray: the file and the async function it names, a
module on the path, the agents extra, and the settings an agent cannot run with. The user's file is read, never
run, by this check."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.core.byo_agent import load_agent_runner
from asyncrl.launch.demo import demo_config_path

AGENT = "async def rollout(client, sample):\n    return 1.0\n"


def load(*overrides: str):
    return load_config(demo_config_path(), ["model.path=/m", "data.train_files=[/t.parquet]", *overrides])


def test_a_good_agent_file_loads_and_is_not_run(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text("raise SystemExit('ran at config time')\n" + AGENT)
    config = load(f"rollout.agent.path={agent}:rollout", "rollout.agent.timeout_s=20", "rollout.agent.max_concurrent=4")
    assert (config.rollout.agent.path, config.rollout.agent.timeout_s, config.rollout.agent.max_concurrent) == \
        (f"{agent}:rollout", 20.0, 4)


def test_a_missing_file_or_function_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout.agent.path=.*nowhere.py:rollout: no file .*nowhere.py"):
        load(f"rollout.agent.path={tmp_path}/nowhere.py:rollout")
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT + "def plain(client, sample):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=r"agent.py defines no async function 'solve'"):
        load(f"rollout.agent.path={agent}:solve")
    with pytest.raises(ConfigError, match=r"'plain' in .*agent.py is not async"):
        load(f"rollout.agent.path={agent}:plain")
    with pytest.raises(ConfigError, match=r"rollout.agent.path must be 'file.py:function'"):
        load(f"rollout.agent.path={agent}")
    with pytest.raises(ConfigError, match=r"no module 'my_agents_nowhere' on the Python path"):
        load("rollout.agent.path=my_agents_nowhere:rollout")
    (tmp_path / "broken.py").write_text("async def rollout(client, sample)\n")
    with pytest.raises(ConfigError, match=r"broken.py does not parse"):
        load(f"rollout.agent.path={tmp_path}/broken.py:rollout")


def test_an_agent_runs_alone(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    with pytest.raises(ConfigError, match="rollout.multi_turn.enable=true are two agent loops"):
        load(f"rollout.agent.path={agent}:rollout", "rollout.multi_turn.enable=true",
             "rollout.multi_turn.tool_config_path=tools.yaml")
    with pytest.raises(ConfigError, match="algorithm.adv_estimator=remax compares each response with a greedy one"):
        load(f"rollout.agent.path={agent}:rollout", "algorithm.adv_estimator=remax")


def test_a_missing_agents_extra_names_the_extra(tmp_path, monkeypatch):
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "openai"
                        else find_spec(name, *args))
    with pytest.raises(ConfigError, match=r"rollout.agent.path needs openai \(not installed\): "
                                          r"pip install 'asyncrl\[agents\]'"):
        load(f"rollout.agent.path={agent}:rollout")


def test_a_run_whose_process_cannot_import_openai_names_the_extra(tmp_path, monkeypatch):
    """The check before Ray sees the packages installed; a process that still cannot import them (another
    environment on a Ray worker) stops with the same advice instead of an ImportError deep in the serving room."""
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    config = load(f"rollout.agent.path={agent}:rollout")
    monkeypatch.setitem(sys.modules, "openai", None)   # `import openai` raises ImportError
    for module in ("asyncrl.serving.agent_runner", "asyncrl.serving.recording"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ConfigError, match=r"rollout.agent.path needs the openai package: pip install 'asyncrl\[agents\]'"):
        load_agent_runner(config, tokenizer=None)
