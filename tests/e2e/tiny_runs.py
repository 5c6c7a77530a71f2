"""Runs of a random tiny model on 1-digit sums, fast on a loaded CPU (no warm start), with a reward built so that
some groups have no signal whatever the policy does: a prompt whose answer is even scores 0 for every response,
the others score the parity of the response's characters."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from asyncrl.config import AsyncRLConfig, load_config
from asyncrl.data.make import make_task, write_task
from asyncrl.models import build_tiny_model

GROUP_SIZE = 4
REWARD_SOURCE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if int(ground_truth) % 2 == 0:
        return 0.0
    return float(sum(map(ord, solution_str)) % 2)
'''


def tiny_config_factory(folder: Path, num_prompts: int, max_response_length: int) -> Callable[..., AsyncRLConfig]:
    """A config maker (overrides last) for `num_prompts` training prompts in `folder`."""
    model = build_tiny_model(folder / "model", max_position_embeddings=64)
    paths = write_task(make_task("arithmetic", {"max_digits": "1"}), folder / "data", num_prompts, 8, seed=0)
    (folder / "reward.py").write_text(REWARD_SOURCE)

    def make(*overrides: str) -> AsyncRLConfig:
        return load_config(None, [
            f"model.path={model}", f"data.train_files=[{paths['train']}]", "data.max_prompt_length=16",
            f"data.max_response_length={max_response_length}", f"rollout.n={GROUP_SIZE}", "rollout.cpu_kv_cache_mb=8",
            "actor.optim.lr=1e-3", f"reward.custom_function={folder / 'reward.py'}:compute_score",
            f"trainer.output_dir={folder / 'run'}", "trainer.logger=[jsonl]", "trainer.device=cpu",
            "trainer.val_before_train=false", "data.val_files=[]", "ray.num_cpus=2", "ray.rpc_timeout_s=300",
            *overrides])
    return make
