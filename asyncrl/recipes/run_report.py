"""The lines `asyncrl train` prints when a run ends, from its summary (`TrainingLoop.summary`): what this run
trained (a resumed run says from which step), in how long, the validation score before and after, and where
the outputs are."""

from __future__ import annotations

from typing import Any

SCORE = "val/score/mean"


def run_report(summary: dict[str, Any]) -> list[str]:
    steps, last_step, resumed_from = summary["steps"], summary["last_step"], summary["resumed_from_step"]
    ran = f"{steps} step{'' if steps == 1 else 's'} in {summary['wall_time_s']:.0f}s"
    resumed = f"resumed at step {resumed_from}; " if resumed_from else ""
    if "stopped_by" in summary:
        lines = [f"stopped by {summary['stopped_by']} after step {last_step} ({resumed}{ran}); run the same command "
                 f"again to continue"]
    else:
        lines = [f"{resumed}finished {ran}" + (f", to step {last_step}" if resumed_from else "")]
    before, after = summary["initial_validation"], summary["final_validation"]
    if SCORE in after:
        start = f"{before[SCORE]:.4g} before training -> " if SCORE in before else ""
        lines.append(f"validation {SCORE}: {start}{after[SCORE]:.4g} at step {last_step}")
    lines.append(f"outputs in {summary['output_dir']}")
    return lines
