"""The one loader of a user's 'file.py:name' or 'module:name' (asyncrl/config/user_code.py): how a spec splits,
where a relative file is read from, what a failure carries; and that the three callers (reward functions, tools,
your own agent) each word the same failure in their own terms."""

from __future__ import annotations

import pytest
import yaml

from asyncrl.config.user_code import ImportFailed, MissingAttribute, MissingFile, UserSpec, load_attribute, split_spec
from asyncrl.rewards import RewardLoadError
from asyncrl.rewards.loader import load_reward_function
from asyncrl.rollout.tools import ToolConfigError, load_tools
from asyncrl.serving.agent_runner import AgentLoadError, load_agent


@pytest.mark.parametrize("spec, expected", [
    ("path/to/score.py:compute", UserSpec("path/to/score.py", "compute")),
    ("package.module:Class", UserSpec("package.module", "Class")),
    ("C:/rewards/score.py:compute", UserSpec("C:/rewards/score.py", "compute")),   # the last colon splits
    ("compute", None), (":compute", None), ("score.py:", None), ("", None),
])
def test_a_spec_splits_at_its_last_colon_or_is_malformed(spec, expected):
    assert split_spec(spec) == expected


def test_is_file_is_read_from_the_location():
    assert UserSpec("a/b.py", "f").is_file and not UserSpec("a.b", "f").is_file


def test_a_relative_file_is_read_from_the_given_folder_else_the_working_directory(tmp_path, monkeypatch):
    folder = tmp_path / "tools"
    folder.mkdir()
    (folder / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    double = load_attribute(UserSpec("helpers.py", "double"), kind="tool", folder=folder)
    assert double(21) == 42 and double.__module__ == "asyncrl_user_tool_helpers"
    with pytest.raises(MissingFile) as missing:
        load_attribute(UserSpec("helpers.py", "double"), kind="tool", folder=tmp_path)
    assert missing.value.file == tmp_path / "helpers.py"
    monkeypatch.chdir(folder)
    assert load_attribute(UserSpec("helpers.py", "double"), kind="agent")(4) == 8
    absolute = UserSpec(str(folder / "helpers.py"), "double")
    assert load_attribute(absolute, kind="reward", folder=tmp_path / "elsewhere")(1) == 2


@pytest.mark.parametrize("top_level, cause", [
    ("raise RuntimeError('no API key')", "RuntimeError: no API key"),
    ("raise SystemExit(3)", "SystemExit: 3"),   # an exit at import is a failed import, not the caller's end
])
def test_a_file_that_raises_at_import_is_a_failure_carrying_the_file_and_the_error(tmp_path, top_level, cause):
    (tmp_path / "broken.py").write_text(f"{top_level}\n")
    with pytest.raises(ImportFailed) as failed:
        load_attribute(UserSpec(str(tmp_path / "broken.py"), "f"), kind="reward")
    assert (failed.value.file, failed.value.cause) == (tmp_path / "broken.py", cause)


def test_a_module_that_does_not_import_carries_no_file():
    with pytest.raises(ImportFailed) as failed:
        load_attribute(UserSpec("no_such_module_for_user_code", "f"), kind="tool")
    assert failed.value.file is None and isinstance(failed.value.error, ModuleNotFoundError)


def test_an_absent_or_none_attribute_is_missing(tmp_path):
    (tmp_path / "defs.py").write_text("nothing = None\n")
    for name in ("absent", "nothing"):
        with pytest.raises(MissingAttribute, match=rf"defs.py defines no '{name}'"):
            load_attribute(UserSpec(str(tmp_path / "defs.py"), name), kind="reward")


def test_each_caller_words_the_same_failure_in_its_own_terms(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\nraise RuntimeError('boom')\n")
    with pytest.raises(RewardLoadError, match=rf"^reward function file {broken} failed to import: "
                                              r"RuntimeError: boom \(line 2\)$"):
        load_reward_function(f"{broken}:score")
    tools = tmp_path / "tools.yaml"
    schema = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    tools.write_text(yaml.safe_dump({"tools": [{"class_name": "broken.py:f", "tool_schema": schema}]}))
    with pytest.raises(ToolConfigError, match=rf"^{tools}: tools\[0\]: class_name: broken.py failed to import: "
                                              r"RuntimeError: boom$"):
        load_tools(tools)
    with pytest.raises(AgentLoadError, match=rf"^rollout.agent.path '{broken}:rollout': {broken} failed to import: "
                                             r"RuntimeError: boom$"):
        load_agent(f"{broken}:rollout")
