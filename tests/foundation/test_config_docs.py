"""docs/configuration.md is generated from the config dataclasses; these tests fail when it is stale.

Regenerate with `asyncrl config docs` after changing `asyncrl/config/schema.py` or a shipped registry entry.
"""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.algos import ADVANTAGE_ESTIMATORS, AdvantageEstimatorSpec
from asyncrl.config import ConfigError, check_named_choices, load_config
from asyncrl.config.docs import render_configuration_markdown
from asyncrl.config.schema import AsyncRLConfig
from asyncrl.rollout import ROLLOUT_BACKENDS, RolloutBackendSpec
from asyncrl.rollout.agent import TOOL_CALL_PARSERS

DOCS_FILE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def leaf_paths(instance, prefix=""):
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        path = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            yield from leaf_paths(value, path + ".")
        else:
            yield path


def row_of(text, key):
    rows = [line for line in text.splitlines() if line.startswith(f"| `{key}` |")]
    assert len(rows) == 1, f"expected one row for {key}, found {len(rows)}"
    return [cell.strip() for cell in rows[0].strip("|").split(" | ")]


def test_configuration_markdown_is_current():
    assert DOCS_FILE.read_text() == render_configuration_markdown(), \
        "docs/configuration.md is stale: run `asyncrl config docs`"


def test_every_leaf_key_has_exactly_one_row():
    text = render_configuration_markdown()
    for path in leaf_paths(AsyncRLConfig()):
        row_of(text, path)


def test_rows_show_type_default_bounds_and_help():
    text = render_configuration_markdown()
    assert row_of(text, "actor.ppo_mini_batch_size") == [
        "`actor.ppo_mini_batch_size`", "int", "`16`", "> 0", "prompts per optimizer step (x rollout.n rows)"]
    key, kind, default, bounds, _ = row_of(text, "actor.optim.lr_warmup_steps_ratio")
    assert (kind, default, bounds) == ("float", "`0.0`", ">= 0.0, <= 1.0")
    # The critic's optimizer overrides the learning rate's default: the subclass's value is the one shown.
    assert row_of(text, "critic.optim.lr")[2] == "`1e-05`"
    assert row_of(text, "trainer.mode")[1] == r"sync \| one_step_off \| fully_async"
    assert row_of(text, "critic.enable")[1:3] == [r"bool \| null", "`null`"]
    assert row_of(text, "trainer.logger")[2] == "`[console, jsonl]`"


def test_sections_carry_their_help():
    text = render_configuration_markdown()
    assert "## algorithm.rollout_correction\n\nOff-policy correction between the rollout" in text
    assert "## async_training\n\nFully-async staleness control." in text


def test_algorithm_keys_list_their_registry_and_each_registry_has_a_table():
    text = render_configuration_markdown()
    shipped = [spec.name for spec in ADVANTAGE_ESTIMATORS.builtin_specs()]  # not what a test registered besides
    assert row_of(text, "algorithm.adv_estimator")[1] == r" \| ".join(shipped)
    assert row_of(text, "algorithm.rollout_correction.rollout_is")[1] == r"token \| sequence \| geometric \| null"
    assert row_of(text, "actor.policy_loss.loss_mode")[4] == "policy loss; see [policy losses](#policy-losses)"
    assert row_of(text, "gae")[2:] == ["yes", "no", "no"]  # needs a critic, compares responses, greedy baseline
    assert row_of(text, "grpo")[2:] == ["no", "yes", "no"]
    assert row_of(text, "vanilla")[2] == "no" and row_of(text, "kl_cov")[2].startswith("how many tokens to pick")
    for heading in ("Advantage estimators", "Policy losses", "KL estimators", "Loss aggregation modes",
                    "Rollout-correction levels"):
        assert f"\n## {heading}\n" in text


def test_a_new_shipped_entry_makes_the_committed_reference_stale(monkeypatch):
    def shipped(token_level_rewards, response_mask, group_ids, knobs=None, *, values=None, reward_baselines=None):
        return token_level_rewards, token_level_rewards
    entry = AdvantageEstimatorSpec(name="shipped", fn=shipped, summary="a new built-in estimator")
    builtins = ADVANTAGE_ESTIMATORS.builtin_specs()
    monkeypatch.setattr(ADVANTAGE_ESTIMATORS, "builtin_specs", lambda: [*builtins, entry])
    text = render_configuration_markdown()
    assert row_of(text, "shipped") == ["`shipped`", "a new built-in estimator", "no", "no", "no"]
    assert DOCS_FILE.read_text() != text


def test_the_rollout_keys_help_is_generated_from_the_rollout_registries(monkeypatch):
    """rollout.backend and rollout.multi_turn.format name registries declared above the config tree (by family):
    their names, their tables and a new shipped entry come from those registries, as an estimator's do."""
    text = render_configuration_markdown()
    backends = [spec.name for spec in ROLLOUT_BACKENDS.builtin_specs()]
    assert row_of(text, "rollout.backend")[1] == r" \| ".join(["auto", *backends])
    assert row_of(text, "rollout.multi_turn.format")[1] == r" \| ".join(TOOL_CALL_PARSERS)
    assert row_of(text, "ray_replicas")[2:] == ["separate", "yes", "no"]   # placement, replica actor, check
    assert row_of(text, "external")[1] == ROLLOUT_BACKENDS.spec("external").summary
    entry = RolloutBackendSpec(name="shipped_backend", fn=ROLLOUT_BACKENDS["external"], summary="a new backend",
                               placement="external")
    builtins = ROLLOUT_BACKENDS.builtin_specs()
    monkeypatch.setattr(ROLLOUT_BACKENDS, "builtin_specs", lambda: [*builtins, entry])
    changed = render_configuration_markdown()
    assert row_of(changed, "shipped_backend")[1:3] == ["a new backend", "external"]
    assert row_of(changed, "rollout.backend")[1].endswith(r"external \| shipped_backend")


def test_rollout_keys_naming_nothing_registered_fail_before_ray_naming_the_closest():
    for key, value, closest in (("rollout.backend", "ray_replica", "ray_replicas"),
                                ("rollout.multi_turn.format", "hermez", "hermes")):
        config = load_config(None, [f"{key}={value}"])   # checked at pre-flight, where the registries are loaded
        with pytest.raises(ConfigError, match=rf"^{key}: unknown .* {value!r}; did you mean {closest!r}\?"):
            check_named_choices(config)
    check_named_choices(load_config(None, ["rollout.backend=auto", "rollout.multi_turn.format=hermes"]))


def test_check_flag_reports_a_stale_file(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text("old\n")
    command = [sys.executable, "-m", "asyncrl.cli", "config", "docs", "--out", str(stale)]
    assert subprocess.run([*command, "--check"], capture_output=True, timeout=120).returncode == 1
    assert subprocess.run(command, capture_output=True, timeout=120).returncode == 0
    assert subprocess.run([*command, "--check"], capture_output=True, timeout=120).returncode == 0
    assert stale.read_text() == render_configuration_markdown()


def test_the_cli_checks_the_reference(tmp_path, capsys):
    from asyncrl.cli import main
    assert main(["config", "docs", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n")
    assert main(["config", "docs", "--check", "--out", str(stale)]) == 1
    assert "stale" in capsys.readouterr().out
    assert main(["config", "docs", "--out", str(stale)]) == 0
    assert stale.read_text() == render_configuration_markdown()
