"""Run checkpoints: trainer state plus the driver's state, written atomically, the last N kept.

    checkpoints/step_12/trainer/...   each rank's sharded model, optimizer, scheduler, RNG
    checkpoints/step_12/driver.json   step, parameter version, data cursor, KL controller, recipe state
    checkpoints/latest                "step_12", written last

A checkpoint is built in `step_12.tmp/` and renamed when complete, so a crash mid-write never leaves a
folder that looks finished; `latest` is updated after the rename. Loading skips (with a message)
a folder without `driver.json` and falls back to the previous one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

DRIVER_FILE = "driver.json"
LATEST_FILE = "latest"


class CheckpointManager:
    def __init__(self, root: str | Path, max_checkpoints: int):
        self.root = Path(root)
        self.max_checkpoints = max_checkpoints

    def save(self, step: int, driver_state: dict[str, Any], save_trainer: Callable[[str], None],
             artifacts: Optional[dict[str, bytes]] = None) -> Path:
        """`artifacts` are extra files of the checkpoint (e.g. a recipe's queued samples)."""
        final = self.root / f"step_{step}"
        staging = self.root / f"step_{step}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_trainer(str(staging / "trainer"))
        for name, payload in (artifacts or {}).items():
            (staging / name).write_bytes(payload)
        # The manifest (every file and its size) lets a later run detect a truncated or partial checkpoint.
        manifest = {str(path.relative_to(staging)): path.stat().st_size for path in sorted(staging.rglob("*"))
                    if path.is_file()}
        (staging / DRIVER_FILE).write_text(json.dumps({**driver_state, "manifest": manifest}, indent=1,
                                                      sort_keys=True))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        self.write_latest(final.name)
        self.prune()
        return final

    def write_latest(self, name: str) -> None:
        temporary = self.root / (LATEST_FILE + ".tmp")
        temporary.write_text(name + "\n")
        os.replace(temporary, self.root / LATEST_FILE)

    def complete_checkpoints(self) -> list[Path]:
        """Finished checkpoint folders, oldest first."""
        if not self.root.is_dir():
            return []
        folders = [path for path in self.root.glob("step_*") if path.is_dir() and not path.name.endswith(".tmp")]
        return sorted(folders, key=lambda path: int(path.name.split("_")[1]))

    def prune(self) -> None:
        for folder in self.complete_checkpoints()[:-self.max_checkpoints]:
            shutil.rmtree(folder, ignore_errors=True)

    def find_resumable(self) -> Optional[Path]:
        """The newest intact checkpoint; a broken one (unreadable driver state, a file missing or of the
        wrong size) is reported and skipped, and the one before it is used."""
        for folder in reversed(self.complete_checkpoints()):
            problem = self.check(folder)
            if problem is None:
                return folder
            logger.warning("skipping checkpoint %s: %s; using an earlier one", folder, problem)
        return None

    @staticmethod
    def check(folder: Path) -> Optional[str]:
        """What is wrong with a checkpoint folder, or None when it is intact."""
        try:
            state = json.loads((folder / DRIVER_FILE).read_text())
        except (OSError, ValueError) as error:
            return f"unreadable {DRIVER_FILE} ({error})"
        for name, size in state["manifest"].items():
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size} bytes, {size} were written (truncated?)"
        return None

    @staticmethod
    def read_driver_state(folder: Path) -> dict[str, Any]:
        return json.loads((folder / DRIVER_FILE).read_text())
