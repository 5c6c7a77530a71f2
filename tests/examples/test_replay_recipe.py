"""The user-written replay recipe in examples/: its pure helpers, then a real run through Ray actors.

The run uses a random tiny model and a reward under which some prompts can never be solved (an even answer scores 0
whatever the response), so unsolved prompts must be replayed, and never more than --max-replays times."""

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from asyncrl.core.records import Sample
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult
from asyncrl.launch import build_runtime
from tests.e2e.tiny_runs import tiny_config_factory

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "replay_unsolved_prompts.py"
BATCH, STEPS, MAX_REPLAYS = 4, 5, 1


def load_example():
    spec = importlib.util.spec_from_file_location("replay_unsolved_prompts", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


replay = load_example()


def sample(prompt: str, index: int, score: float) -> Sample:
    record = PromptRecord(prompt, [{"role": "user", "content": "1+1="}], "test", "2")
    result = GenerationResult(f"{prompt}/{index}", np.array([5], dtype=np.int32), np.array([7], dtype=np.int32),
                              np.zeros(1, dtype=np.float32), np.zeros(1, dtype=np.int32), "stop")
    return Sample(TokenizedPrompt(record, [5]), 0, index, result, score=score)


def test_a_prompt_is_unsolved_when_no_response_scores_above_the_bar():
    samples = [sample("a", 0, 0.0), sample("a", 1, 1.0), sample("b", 0, 0.0), sample("b", 1, 0.0),
               sample("c", 0, 0.5)]
    assert replay.unsolved_prompts(samples, 0.0) == ["b"]
    assert replay.unsolved_prompts(samples, 0.5) == ["b", "c"]


def test_the_replay_share_caps_what_comes_from_the_queue():
    assert replay.num_from_replay(8, 10, 0.5) == 4
    assert replay.num_from_replay(8, 3, 0.5) == 3
    assert replay.num_from_replay(8, 10, 0.0) == 0


def test_bad_settings_and_other_modes_are_refused(capsys):
    with pytest.raises(ValueError, match="replay_share must be within 0 .. 1, got 1.5"):
        replay.ReplaySettings(replay_share=1.5)
    assert replay.main(["trainer.mode=one_step_off", "rollout.n_gpus_per_node=1"]) == 2
    assert "needs trainer.mode=sync" in capsys.readouterr().err


@pytest.mark.slow
def test_unsolved_prompts_come_back_at_most_max_replays_times(tmp_path, ray_session):
    config = tiny_config_factory(tmp_path, 32, 4)(
        f"data.train_batch_size={BATCH}", f"actor.ppo_mini_batch_size={BATCH}", f"trainer.total_steps={STEPS}",
        "trainer.dump_rollouts=true")
    runtime = build_runtime(config)
    try:
        summary = replay.ReplayRecipe(runtime, replay.ReplaySettings(0.5, MAX_REPLAYS, 0.0)).fit()
    finally:
        runtime.close()
    assert summary["steps"] == STEPS
    output = Path(config.trainer.output_dir)
    rows = {row["step"]: row for row in map(json.loads, (output / "metrics.jsonl").open()) if "replay/queue_size" in row}
    steps = {step: [json.loads(line) for line in (output / "rollouts" / f"step_{step}.jsonl").open()]
             for step in range(1, STEPS + 1)}
    tries = Counter()
    seen_unsolved: set[str] = set()
    for step in range(1, STEPS + 1):
        prompts = {sample["prompt_id"] for sample in steps[step]}
        assert len(prompts) == BATCH
        replayed = prompts & seen_unsolved
        # Replays are the queue's head: as many as the share allows, each an earlier step's unsolved prompt.
        assert rows[step]["replay/num_replayed"] == len(replayed) <= BATCH // 2
        tries.update(prompts)
        best = {prompt: max(s["score"] for s in steps[step] if s["prompt_id"] == prompt) for prompt in prompts}
        unsolved = {prompt for prompt, score in best.items() if score <= 0.0}
        assert rows[step]["replay/num_unsolved"] == len(unsolved)
        seen_unsolved |= unsolved
    assert max(tries.values()) == 1 + MAX_REPLAYS   # some prompt (an even answer) was replayed, and no more
    assert sum(row["replay/num_replayed"] for row in rows.values()) > 0
