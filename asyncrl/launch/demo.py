"""`asyncrl demo`: the main job on the embedded default, end to end on a laptop CPU.

    asyncrl demo                                   # 2-digit sums, sync mode
    asyncrl demo --task longtail --mode fully_async  # long-tailed response lengths: the async modes' workload
    asyncrl demo --setup-only                      # only the data and the warm-started model, for your own job
    asyncrl demo --model-family qwen3_moe          # a mixture-of-experts policy (docs/moe.md)

1. writes the task (2-digit addition) as parquet in verl's schema, with warm-start answers from a "sloppy
   teacher" that often repeats the last digit (the reward checks the exact sum);
2. builds a tiny character-level model, Qwen2-style unless `--model-family` names another (qwen3_moe, mixtral:
   4 experts, 2 per token);
3. warm-starts it with SFT on the teacher's answers: it learns to add, and the stutter;
4. trains it with GRPO through Ray actors in `--mode`, with the demo task's settings for that mode;
5. prints validation accuracy before and after, and where the outputs are.

Steps 1-3 (the setup) are cached under `<out>/setup/<task>/` (`<task>-<family>/` for another family than
qwen2), keyed by their settings (`setup.json`): a later demo of the same task, in any mode, starts at step 4. `--rebuild-setup` makes them again.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from asyncrl.config import AsyncRLConfig, load_config
from asyncrl.data.demo_tasks import DEFAULT_MODE, DEFAULT_TASK, DEMO_TASKS, DemoTask, demo_task
from asyncrl.data.make import make_task, write_task
from asyncrl.launch.modes import train
from asyncrl.models import build_tiny_model
from asyncrl.train.sft import SFTSettings, run_sft

logger = logging.getLogger(__name__)

DEFAULT_FAMILY = "qwen2"

SETUP_FILE_NAME = "setup.json"  # written last: its presence means the setup is complete


@dataclass(frozen=True)
class DemoSetup:
    """The demo's inputs on disk: the task's parquet files and the warm-started HF folder."""

    folder: Path
    train_file: Path
    val_file: Path
    model: Path


def demo_config_path() -> Path:
    return Path(str(resources.files("asyncrl") / "configs" / "demo.yaml"))


def setup_settings(demo: DemoTask, seed: int, family: str = DEFAULT_FAMILY) -> dict[str, Any]:
    """What the cached setup depends on; a different value rebuilds it."""
    settings = {"task": demo.task, "knobs": demo.knobs, "train_size": demo.train_size, "val_size": demo.val_size,
                "sft": asdict(SFTSettings(epochs=demo.sft_epochs, seed=seed)), "model_shape": demo.model_shape,
                "seed": seed}
    if family != DEFAULT_FAMILY:
        settings["model_family"] = family
    if demo.warm_start_from:
        settings["warm_start_from"] = {"demo": demo.warm_start_from,
                                       **setup_settings(DEMO_TASKS[demo.warm_start_from], seed, family)}
    return settings


def setup_folder(output_dir: str | Path, task_name: str, family: str) -> Path:
    return Path(output_dir) / "setup" / (task_name if family == DEFAULT_FAMILY else f"{task_name}-{family}")


def prepare_setup(output_dir: str | Path, task_name: str = DEFAULT_TASK, seed: int = 0,
                  rebuild: bool = False, family: str = DEFAULT_FAMILY) -> DemoSetup:
    """Steps 1-3 under `setup_folder(...)`, reused when its `setup.json` holds the same settings."""
    demo = demo_task(task_name)
    folder = setup_folder(output_dir, task_name, family)
    setup = DemoSetup(folder, folder / "data" / "train.parquet", folder / "data" / "val.parquet", folder / "model")
    settings = setup_settings(demo, seed, family)
    record = folder / SETUP_FILE_NAME
    if not rebuild and record.is_file() and json.loads(record.read_text()) == settings:
        print(f"[demo] 1-3/4 reusing the data and warm-started model in {folder} (--rebuild-setup makes them again)",
              flush=True)
        return setup
    shutil.rmtree(folder, ignore_errors=True)
    print(f"[demo] 1/4 writing the {task_name} task to {folder / 'data'}", flush=True)
    write_task(make_task(demo.task, demo.knobs), folder / "data", demo.train_size, demo.val_size, seed)
    if demo.warm_start_from:
        print(f"[demo] 2/4 starting from the {demo.warm_start_from} demo's warm-started model", flush=True)
        initial = prepare_setup(output_dir, demo.warm_start_from, seed, family=family).model
    else:
        print(f"[demo] 2/4 building a tiny {family} model", flush=True)
        initial = build_tiny_model(folder / "initial_model", family=family, seed=seed, **demo.model_shape)
    print(f"[demo] 3/4 SFT warm start ({demo.sft_epochs} epochs)", flush=True)
    run_sft(initial, [str(setup.train_file)], setup.model, SFTSettings(epochs=demo.sft_epochs, seed=seed))
    if not demo.warm_start_from:
        shutil.rmtree(initial)
    record.write_text(json.dumps(settings, indent=1) + "\n")
    return setup


def run_folder(output_dir: str | Path, task_name: str, mode: str, config: AsyncRLConfig,
               family: str = DEFAULT_FAMILY) -> Path:
    """`output_dir/<task>-<mode>/`, `-<family>` added for another model family and `-lora` for a LoRA policy: a
    variant never overwrites the plain demo's run, nor the policy a server may be serving from it."""
    variant = ("" if family == DEFAULT_FAMILY else f"-{family}") + ("-lora" if config.model.lora_rank > 0 else "")
    return Path(output_dir) / f"{task_name}-{mode}{variant}"


def run_demo(output_dir: str | Path, mode: str = DEFAULT_MODE, overrides: list[str] | None = None,
             task_name: str = DEFAULT_TASK, seed: int = 0, rebuild_setup: bool = False,
             family: str = DEFAULT_FAMILY) -> dict[str, Any]:
    """The whole demo; the run goes to `run_folder(...)` (a demo always starts it fresh) unless the overrides
    name a `trainer.output_dir`, which is used as given (and resumed from, like any run's)."""
    started = time.monotonic()
    demo = demo_task(task_name)
    setup = prepare_setup(output_dir, task_name, seed, rebuild_setup, family)
    print(f"[demo] 4/4 GRPO in trainer.mode={mode} on {task_name}: {demo.summary}", flush=True)
    overrides = [f"model.path={setup.model}", f"data.train_files=[{setup.train_file}]",
                 f"data.val_files=[{setup.val_file}]", f"trainer.mode={mode}", *demo.run_overrides(mode),
                 *(overrides or [])]
    config = load_config(demo_config_path(), overrides)
    if not any(override.startswith("trainer.output_dir=") for override in overrides):
        run_dir = run_folder(output_dir, task_name, mode, config, family)
        shutil.rmtree(run_dir, ignore_errors=True)
        config = load_config(demo_config_path(), [*overrides, f"trainer.output_dir={run_dir}"])
    summary = train(config)
    if "stopped_by" in summary:  # a signal ended it early: there is no final validation to report
        print(f"\n[demo] stopped by {summary['stopped_by']} after step {summary['last_step']}; outputs: "
              f"{summary['output_dir']}")
        return summary
    before = summary["initial_validation"].get("val/score/mean", float("nan"))
    after = summary["final_validation"].get("val/score/mean", float("nan"))
    print(f"\n[demo] validation accuracy: {before:.1%} after SFT -> {after:.1%} after GRPO "
          f"({summary['wall_time_s']:.0f}s of RL, {time.monotonic() - started:.0f}s in all)")
    print(f"[demo] outputs: {summary['output_dir']} (metrics.jsonl, summary.json, timeline.json, plots/, policy/)")
    return summary
