"""Bring your own agent end to end through real Ray actors: `examples/openai_agent.py`, written with the official
`openai` client, trains the demo's warm-started model in every mode through the recording endpoint (uvicorn on
127.0.0.1) and its reward rises; every model token that trained is a token the client received in an HTTP
response (the tokens are not re-tokenized text); in fully_async with partial rollout, weight syncs fall inside
agent runs and some trained samples carry two policy versions."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from asyncrl.launch import train
from asyncrl.telemetry import read_metrics

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_agent.py"
VAL_GAIN = 0.2      # the agent's reward at validation (greedy; 1 first try, 0.5 second, 0 else), before -> after
SCORE_GAIN = 0.1    # the same reward in training (sampled), the first 3 steps -> the last 3
MODES = {
    "sync": (),
    "one_step_off": ("trainer.mode=one_step_off", "rollout.n_gpus_per_node=1"),
    "fully_async": ("trainer.mode=fully_async", "rollout.n_gpus_per_node=1", "async_training.staleness_threshold=0.5",
                    "async_training.partial_rollout=true", "async_training.trigger_parameter_sync_step=1"),
}

# The example, its client wrapped so that each chat completion's ids, as the HTTP response gave them, are logged,
# and, on one prompt in four, a second try waits DELAY seconds first, as for a slow tool's answer. The log's path
# is written into the file: the agent runs in the driver or in the rollouter actor.
LOGGING_AGENT = '''
import asyncio
import importlib.util
import json
import zlib

spec = importlib.util.spec_from_file_location("openai_agent_example", EXAMPLE)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


class Completions:
    def __init__(self, client, delay):
        self.client = client
        self.delay = delay

    async def create(self, **kwargs):
        if len(kwargs["messages"]) > 1 and self.delay:
            await asyncio.sleep(self.delay)
        reply = await self.client.chat.completions.create(**kwargs, extra_body={"return_token_ids": True})
        with open(LOG, "a") as handle:
            handle.write(json.dumps({"ids": reply.choices[0].token_ids}) + "\\n")
        return reply


class Chat:
    def __init__(self, client, delay):
        self.completions = Completions(client, delay)


class LoggedClient:
    def __init__(self, client, delay):
        self.models = client.models
        self.chat = Chat(client, delay)


async def rollout(client, sample):
    is_slow = zlib.crc32(sample.prompt_id.encode()) % 4 == 0
    return await example.rollout(LoggedClient(client, DELAY if is_slow else 0.0), sample)
'''


# In fully_async the slow prompts' second tries wait longer than a training step: the trainer trains and syncs on
# the other groups meanwhile, so weight syncs fall inside those runs (without them the rollouter, faster than the
# trainer on this task, ends every run a version admits before the sync that ends it).
SECOND_TRY_DELAY_S = {"sync": 0.0, "one_step_off": 0.0, "fully_async": 6.0}


def logging_agent(folder: Path, delay_s: float) -> tuple[Path, Path]:
    log = folder / "completions.jsonl"
    agent = folder / "logging_agent.py"
    agent.write_text(f"EXAMPLE = {str(EXAMPLE)!r}\nLOG = {str(log)!r}\nDELAY = {delay_s}\n" + LOGGING_AGENT)
    return agent, log


def model_segments(record: dict) -> list[tuple[int, ...]]:
    """The runs of model tokens (loss mask 1) of a dumped sample: one per completion it trained."""
    ids, mask = np.array(record["response_ids"]), np.array(record["loss_mask"])
    edges = np.flatnonzero(np.diff(mask)) + 1
    return [tuple(part.tolist()) for part, flags in zip(np.split(ids, edges), np.split(mask, edges)) if flags[0] == 1]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_openai_agent_learns_and_trains_the_tokens_its_client_received(mode, make_config, ray_session, tmp_path):
    agent, log = logging_agent(tmp_path, SECOND_TRY_DELAY_S[mode])
    config = make_config(*MODES[mode], f"rollout.agent.path={agent}:rollout", "trainer.total_steps=12",
                         "trainer.test_freq=0", "trainer.dump_rollouts=true")
    summary = train(config)
    before = summary["initial_validation"]["val/score/mean"]
    after = summary["final_validation"]["val/score/mean"]
    assert after >= before + VAL_GAIN, (mode, before, after)
    output = Path(config.trainer.output_dir)
    rows = [row for row in read_metrics(output / "metrics.jsonl") if "critic/score/mean" in row]
    assert [row["step"] for row in rows] == list(range(1, 13))
    scores = [row["critic/score/mean"] for row in rows]
    assert np.mean(scores[-3:]) >= np.mean(scores[:3]) + SCORE_GAIN, (mode, scores)
    records = [json.loads(line) for step in range(1, 13)
               for line in (output / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
    assert rows[-1]["agent/errors"] == 0 and rows[-1]["agent/timeouts"] == 0
    assert rows[-1]["agent/samples"] >= rows[-1]["agent/runs"] > 0 and records
    assert max(row["num_turns/max"] for row in rows) == 2            # wrong first answers got a second try
    # Every trained completion is one the client received, token for token (each at most as often).
    received = Counter(tuple(json.loads(line)["ids"]) for line in log.read_text().splitlines())
    trained = Counter(segment for record in records for segment in model_segments(record))
    assert sum(trained.values()) >= len(records) and not trained - received, (trained - received).most_common(3)
    two_tries = [record for record in records if len(model_segments(record)) == 2]
    assert two_tries and all(0 in record["loss_mask"] for record in two_tries)   # the feedback tokens: masked
    if mode == "fully_async":
        # Syncs fell inside agent runs: some trained samples' model tokens come from two policy versions.
        assert rows[-1]["agent/samples_across_versions"] > 0
        assert any(len(set(np.array(record["token_versions"])[np.array(record["loss_mask"]) == 1])) > 1
                   for record in records)
