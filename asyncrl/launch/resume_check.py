"""Where a run starts, decided before Ray starts or any file of the earlier run is overwritten.

    point = check_resume(config, output_dir, len(train_data))   # ResumePoint(folder, step)

With trainer.resume=auto the newest intact checkpoint under trainer.output_dir is found (each checkpoint is
verified file by file, so this is done once and handed to the training loop through `Runtime.resume_from`).
A checkpoint whose config differs in a key a resume cannot bridge (a changed trainer.mode, rollout.n, ...)
raises `IncompatibleCheckpointError`, and one of a run that already finished raises `RunAlreadyFinished`:
both before anything starts, so the earlier run's config.yaml, timeline.json and metrics stay as they were.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from asyncrl.config import AsyncRLConfig
from asyncrl.core.checkpoint import CheckpointManager
from asyncrl.data.sampler import PromptSampler
from asyncrl.recipes.errors import IncompatibleCheckpointError, RunAlreadyFinished
from asyncrl.recipes.training_loop import check_compatible, find_resume_checkpoint, total_training_steps

SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class ResumePoint:
    folder: Optional[Path]   # the checkpoint to resume from; None for a fresh start
    step: int                # the last step it finished (0 for a fresh start)


def check_resume(config: AsyncRLConfig, output_dir: Path, num_prompts: int) -> ResumePoint:
    """The checkpoint this run resumes from, checked against the config and against the run being over."""
    folder = find_resume_checkpoint(config, output_dir)
    if folder is None:
        return ResumePoint(None, 0)
    state = CheckpointManager.read_driver_state(folder)
    check_compatible(state["config"], dataclasses.asdict(config), folder)
    sampler = PromptSampler(num_prompts, config.data.shuffle, config.data.seed, config.trainer.total_epochs)
    try:
        sampler.load_state_dict(state["sampler"])
    except ValueError as error:
        raise IncompatibleCheckpointError(f"cannot resume from {folder}: its data cursor does not fit the "
                                          f"training data ({error}; did the files of data.train_files change?). "
                                          f"Use the original data, another trainer.output_dir, or "
                                          f"trainer.resume=disable.") from None
    step = state["step"]
    # What ended it: its data (every epoch trained) or its step budget; each has its own way to go further.
    ways_further = [f"trainer.total_epochs (now {config.trainer.total_epochs})"] if sampler.is_exhausted else []
    if step >= total_training_steps(config, num_prompts) and not sampler.is_exhausted:
        ways_further.append(f"trainer.total_steps (now {config.trainer.total_steps})")
    earlier = finished_summary(output_dir, step)
    if ways_further and earlier is not None:
        raise RunAlreadyFinished(finished_message(output_dir, folder, step, ways_further), earlier)
    return ResumePoint(folder, step)


def finished_summary(output_dir: Path, step: int) -> Optional[dict[str, Any]]:
    """summary.json when it was written at `step`: the run ended there (final validation, policy export). A
    run stopped by a signal, or killed, at its last step has none, and resuming it finishes those."""
    path = output_dir / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text())
        return summary if summary["last_step"] == step else None
    except (OSError, ValueError, KeyError, TypeError):   # none, or not one asyncrl wrote: not finished
        return None


def finished_message(output_dir: Path, folder: Path, step: int, ways_further: list[str]) -> str:
    return (f"trainer.output_dir={output_dir} holds a finished run ({step} steps; last checkpoint {folder}): "
            f"nothing to train, nothing was started. To train again, give another trainer.output_dir, or "
            f"trainer.resume=disable to start over in this folder (its outputs are overwritten); to train this run "
            f"further, raise {' or '.join(ways_further)}.")
