"""The config of an e2e run on the demo's warm-started policy, for the `make_config` fixture and for fixtures of a
wider scope that make a run several tests read."""

from __future__ import annotations

from pathlib import Path

from asyncrl.config import AsyncRLConfig, load_config
from asyncrl.data.demo_tasks import MODEL_SHAPE
from asyncrl.launch.demo import demo_config_path

# vLLM's CPU attention runs heads of 32 dimensions and up: the demo's models twice as wide, 4 heads of 32.
VLLM_SHAPE = {**MODEL_SHAPE, "hidden_size": 128, "num_heads": 4, "num_kv_heads": 2}


def warm_config(warm_policy: dict[str, Path], output_dir: Path, *overrides: str) -> AsyncRLConfig:
    """The demo's config on `warm_policy` (conftest's fixture), writing into `output_dir` (overrides last)."""
    return load_config(demo_config_path(), [
        f"model.path={warm_policy['model']}", f"data.train_files=[{warm_policy['train']}]",
        f"data.val_files=[{warm_policy['val']}]", f"trainer.output_dir={output_dir}",
        "trainer.device=cpu", "trainer.logger=[jsonl]", "ray.rpc_timeout_s=300", *overrides])
