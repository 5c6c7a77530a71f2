"""asyncrl against TRL's `GRPOTrainer`: the same model, prompts, sampling and budget, side by side.

    bash benchmarks/trl_venv.sh                                   # once, on a CPU machine: TRL 1.16 in outputs/trl-venv
    python benchmarks/trl_side_by_side.py --workload issue --runs 3
    python benchmarks/trl_side_by_side.py --workload demo --runs 3
    python benchmarks/trl_side_by_side.py --workload gpu-learn --order A,T,A,A --trl-python python3   # one GPU

Each run of a workload is one `asyncrl train` (sync mode, a subprocess, as a user runs it) or one TRL run
(`benchmarks/trl_grpo.py`, in TRL's own virtual environment on a CPU machine or any python that has TRL), in the
order `--order` gives (default A, T, A, T, ...), so that load from other work on the machine falls on both alike.
Both start from the same model with the character tokenizer, on the same arithmetic prompts (asyncrl's chat
template, the same token ids on both sides), sample at the same temperature, and take one optimizer step per
generation of `prompts_per_step x n` completions (TRL's `per_device_train_batch_size` x its gradient accumulation =
asyncrl's mini-batch; both forward `micro_batch_rows` rows at a time), with no KL term, token-mean loss
aggregation (TRL's `dapo`), clip 0.2, AdamW at the same constant learning rate and no weight decay.
Completions/s = completions over the summed wall times of the steps (generation, rewards, update; asyncrl's weight
sync too), start-up and validation excluded. The report gives each side's min and median over the runs, the
machine's load average before and after, and writes everything to `outputs/bench/trl_side_by_side_<workload>.json`.

Speed workloads (random weights, EOS ignored so every completion is exactly `response_length` tokens, fp32):
- `issue`: hidden 256, 4 layers, 4 heads (2 KV), MLP 688 (2.9M parameters); 16 prompts x 8 samples x 64 tokens
  per step, 8 steps.
- `demo`: `asyncrl demo`'s model (hidden 64, 2 layers, 130k parameters), 32 prompts x 8 samples x 4 tokens per step,
  25 steps (random weights: the demo's SFT warm start changes what is learned, not the cost of a step).

The learning workload, on one GPU (`gpu-learn`): a Qwen2-shaped model of 75M parameters (hidden 768, 12 layers, 12
heads, 2 KV heads, MLP 2048) warm-started by SFT on a sloppy teacher's answers to 3-4 digit sums (half the answers
stutter their last digit; every answer is followed by a run of '.' of log-normal length, median 16, cap 128, then
EOS: a long tail of response lengths), then GRPO with real EOS: 32 prompts x 8 samples per step at temperature 1,
lr 2e-5, micro-batches of 64 rows, bf16 compute on both sides. Greedy validation on 256 held-out sums every
`eval_every` steps on both sides (TRL: a callback running `generate` on the same prompts, scored by the same rule,
outside the timed steps); `gpu-learn-slow` is the same with a teacher that stutters 4 answers in 5, half the warm
start's rows and half the learning rate, so that RL takes tens of steps; *time to an accuracy* is the summed step time up to the first validation at or above
it. The warm start is made once per folder (`setup.json` records its settings) and shared by every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as parquet

from asyncrl.config.schema import DataConfig
from asyncrl.data.dataset import PromptDataset
from asyncrl.data.make import make_task, write_task
from asyncrl.models import build_tiny_model, load_tokenizer
from asyncrl.train.sft import SFTSettings, run_sft

REPO = Path(__file__).resolve().parent.parent
TRL_VENV_PYTHON = REPO / "outputs" / "trl-venv" / "bin" / "python"
ACCURACY_THRESHOLDS = tuple(round(0.05 * step, 2) for step in range(6, 20))  # 0.30 ... 0.95


@dataclass(frozen=True)
class Workload:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    prompts_per_step: int
    n: int
    response_length: int   # the budget per completion (exact when ignore_eos)
    steps: int
    lr: float = 1e-6
    seed: int = 0
    threads: int = 2
    task_knobs: tuple[tuple[str, str], ...] = (("min_digits", "2"), ("max_digits", "2"), ("operators", "+"))
    device: str = "cpu"
    ignore_eos: bool = True
    temperature: float = 1.0
    micro_batch_rows: int = 0      # rows per forward and backward; 0: all of a step's rows at once
    max_position_embeddings: int = 256
    val_size: int = 16
    eval_every: int = 0            # greedy validation every N steps (and before the first); 0: none
    sft_rows: int = 0              # SFT warm start on this many teacher answers; 0: random weights
    sft_epochs: float = 1.0
    sft_lr: float = 1e-3
    sft_batch_size: int = 256

    @property
    def rows_per_step(self) -> int:
        return self.prompts_per_step * self.n

    @property
    def micro_rows(self) -> int:
        return self.micro_batch_rows or self.rows_per_step


GPU_LEARN = Workload(hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=2, intermediate_size=2048,
                   prompts_per_step=32, n=8, response_length=144, steps=40, lr=2e-5,
                   task_knobs=(("min_digits", "3"), ("max_digits", "4"), ("operators", "+"),
                               ("sloppy_teacher", "0.5"), ("tail_median", "16"), ("tail_cap", "128")),
                   device="cuda", ignore_eos=False, micro_batch_rows=64, val_size=256, eval_every=5,
                   sft_rows=400_000, sft_epochs=1.0, sft_lr=6e-4, sft_batch_size=256)

WORKLOADS = {
    "issue": Workload(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=688,
                      prompts_per_step=16, n=8, response_length=64, steps=8),
    "demo": Workload(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256,
                     prompts_per_step=32, n=8, response_length=4, steps=25),
    "gpu-learn": GPU_LEARN,
    # gpu-learn is learned by the first validation (RL only has to drop a stutter that half the teacher's answers
    # have): here the teacher stutters 4 times in 5, so greedy decoding starts near 0%, the warm start sees half the
    # rows, and the learning rate is halved, so the curve takes tens of steps and time to accuracy separates systems.
    "gpu-learn-slow": dataclasses.replace(
        GPU_LEARN, lr=1e-5, eval_every=4, sft_rows=200_000,
        task_knobs=(("min_digits", "3"), ("max_digits", "4"), ("operators", "+"), ("sloppy_teacher", "0.8"),
                    ("tail_median", "16"), ("tail_cap", "128"))),
    # The learning workload's plumbing at a size a CPU runs in a minute or two (tests of the script, not a figure).
    "cpu-learn-smoke": Workload(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256,
                                prompts_per_step=8, n=4, response_length=24, steps=4, lr=1e-4,
                                task_knobs=(("min_digits", "2"), ("max_digits", "2"), ("operators", "+"),
                                            ("sloppy_teacher", "0.5"), ("tail_median", "4"), ("tail_cap", "16")),
                                ignore_eos=False, micro_batch_rows=16, val_size=16, eval_every=2,
                                sft_rows=2000, sft_epochs=1.0, sft_lr=3e-3, sft_batch_size=64),
}


def prepare(workload: Workload, folder: Path) -> None:
    """The model (warm-started when the workload asks), the arithmetic data (parquet, verl's schema), and for TRL
    `prompts.jsonl` / `val_prompts.jsonl` (each prompt's rendered text, ids and ground truth). Reused when
    `setup.json` in the folder holds the same workload."""
    settings = dataclasses.asdict(workload)
    record = folder / "setup.json"
    if record.is_file() and json.loads(record.read_text()) == json.loads(json.dumps(settings)):
        print(f"reusing the model and data in {folder}", flush=True)
        return
    folder.mkdir(parents=True, exist_ok=True)
    rl_size = workload.prompts_per_step * workload.steps * 4
    paths = write_task(make_task("arithmetic", dict(workload.task_knobs)), folder / "data",
                       train_size=max(rl_size, workload.sft_rows), val_size=workload.val_size, seed=workload.seed)
    # RL draws from the first rows (the SFT set's too, as a user's RL prompts usually are); TRL gets the same rows.
    rl_file = folder / "data" / "rl.parquet"
    parquet.write_table(parquet.read_table(paths["train"]).slice(0, rl_size), rl_file)
    model = build_tiny_model(folder / "initial_model", family="qwen2", seed=workload.seed,
                             hidden_size=workload.hidden_size, num_layers=workload.num_layers,
                             num_heads=workload.num_heads, num_kv_heads=workload.num_kv_heads,
                             intermediate_size=workload.intermediate_size,
                             max_position_embeddings=workload.max_position_embeddings)
    if workload.sft_rows:
        started = time.monotonic()
        run_sft(model, [str(paths["train"])], folder / "model",
                SFTSettings(epochs=workload.sft_epochs, batch_size=workload.sft_batch_size, lr=workload.sft_lr,
                            warmup_steps=100, seed=workload.seed, device=workload.device, group_by_length=True))
        print(f"SFT warm start: {time.monotonic() - started:.0f} s", flush=True)
    else:
        model.rename(folder / "model")
    tokenizer = load_tokenizer(folder / "model")
    write_prompts(rl_file, tokenizer, folder / "prompts.jsonl")
    write_prompts(paths["val"], tokenizer, folder / "val_prompts.jsonl")
    (folder / "workload.json").write_text(json.dumps(settings, indent=1))
    record.write_text(json.dumps(settings, indent=1))


def write_prompts(parquet_file: Path, tokenizer: Any, out: Path) -> None:
    dataset = PromptDataset.from_files([str(parquet_file)], tokenizer, DataConfig())
    with out.open("w") as handle:
        for prompt in dataset.prompts:
            text = tokenizer.decode(prompt.prompt_ids, skip_special_tokens=False)
            handle.write(json.dumps({"prompt": text, "prompt_ids": list(prompt.prompt_ids),
                                     "ground_truth": prompt.record.ground_truth}) + "\n")


def asyncrl_overrides(workload: Workload, folder: Path, run_folder: Path) -> list[str]:
    validation = ([f"data.val_files=[{folder / 'data' / 'val.parquet'}]", f"data.val_batch_size={workload.val_size}",
                   f"trainer.test_freq={workload.eval_every}", "trainer.val_before_train=true"]
                  if workload.eval_every else ["trainer.val_before_train=false"])
    return [f"model.path={folder / 'model'}", f"data.train_files=[{folder / 'data' / 'rl.parquet'}]",
            f"data.train_batch_size={workload.prompts_per_step}", "data.max_prompt_length=32",
            f"data.max_response_length={workload.response_length}",
            f"rollout.n={workload.n}", f"rollout.ignore_eos={str(workload.ignore_eos).lower()}",
            f"rollout.temperature={workload.temperature}",
            f"actor.ppo_mini_batch_size={workload.prompts_per_step}", f"actor.optim.lr={workload.lr}",
            "actor.optim.weight_decay=0.0", "actor.loss_agg_mode=token-mean",
            f"actor.ppo_micro_batch_size_per_gpu={workload.micro_rows}",
            "algorithm.adv_estimator=grpo", "trainer.mode=sync", f"trainer.device={workload.device}",
            f"trainer.total_steps={workload.steps}", "trainer.resume=disable",
            "trainer.logger=[jsonl]", f"trainer.output_dir={run_folder}", f"trainer.seed={workload.seed}",
            *validation]


def run_asyncrl(workload: Workload, folder: Path, name: str, extra: list[str]) -> dict:
    run_folder = folder / name
    command = [sys.executable, "-m", "asyncrl.cli", "train", *asyncrl_overrides(workload, folder, run_folder), *extra]
    started = time.monotonic()
    completed = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    wall_s = time.monotonic() - started
    if completed.returncode != 0:
        raise RuntimeError(f"asyncrl train failed ({completed.returncode}):\n{completed.stderr[-4000:]}")
    rows = [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "timing_s/step" in row]
    step_seconds = sum(step["timing_s/step"] for step in steps)
    completions = workload.rows_per_step * len(steps)
    stages = {key: sum(step.get(key, 0.0) for step in steps)
              for key in ("timing_s/gen", "timing_s/update_actor", "timing_s/sync_weights", "timing_s/reward",
                          "timing_s/old_log_prob")}
    seconds_by_step = cumulative_seconds([step["timing_s/step"] for step in steps])
    validation = [(row["step"], row["val/score/mean"]) for row in rows if "val/score/mean" in row]
    return {"system": "asyncrl", "steps": len(steps), "completions": completions, "step_seconds": step_seconds,
            "completions_per_s": completions / step_seconds, "stages": stages, "wall_seconds": wall_s,
            "per_step_seconds": [step["timing_s/step"] for step in steps],
            "mean_response_length": [step["response_length/mean"] for step in steps],
            "max_response_length": [step["response_length/max"] for step in steps if "response_length/max" in step],
            "training_score": [step["critic/score/mean"] for step in steps],
            "validation": curve(validation, seconds_by_step),
            "logprob_agreement": logprob_agreement(steps), "overrides": extra}


def run_trl(folder: Path, python: str) -> dict:
    if python == str(TRL_VENV_PYTHON) and not TRL_VENV_PYTHON.exists():
        raise RuntimeError(f"{TRL_VENV_PYTHON} is missing: run `bash benchmarks/trl_venv.sh` first")
    started = time.monotonic()
    completed = subprocess.run([python, str(REPO / "benchmarks" / "trl_grpo.py"), str(folder)],
                               capture_output=True, text=True, cwd=REPO)
    if completed.returncode != 0:
        raise RuntimeError(f"TRL run failed ({completed.returncode}):\n{completed.stderr[-4000:]}")
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = time.monotonic() - started
    validation = [(step, score) for step, score in result.pop("validation_scores")]
    result["validation"] = curve(validation, cumulative_seconds(result["per_step_seconds"]))
    return result


def cumulative_seconds(per_step: list[float]) -> list[float]:
    """Seconds of training by the end of each step, index 0 = before the first step."""
    totals = [0.0]
    for seconds in per_step:
        totals.append(totals[-1] + seconds)
    return totals


def curve(validation: list[tuple[int, float]], seconds_by_step: list[float]) -> dict[str, Any]:
    """The validation curve against training time and, per accuracy threshold, the training seconds (and step) by
    the first validation at or above it (None: never reached)."""
    points = [{"step": step, "score": score, "train_seconds": seconds_by_step[min(step, len(seconds_by_step) - 1)]}
              for step, score in validation]
    reached = {}
    for threshold in ACCURACY_THRESHOLDS:
        first = next((point for point in points if point["score"] >= threshold - 1e-9), None)
        reached[f"{threshold:.2f}"] = None if first is None else {"step": first["step"],
                                                                  "train_seconds": first["train_seconds"]}
    return {"points": points, "time_to": reached}


def logprob_agreement(steps: list[dict[str, Any]]) -> dict[str, float] | None:
    """Rollout against trainer log-probs on the same tokens over the run (decoupled mode reports them:
    `algorithm.rollout_correction.bypass_mode=false`), or None."""
    rows = [row for row in steps if "rollout_corr/abs_log_ratio_mean" in row]
    if not rows:
        return None
    return {"abs_mean": statistics.fmean(row["rollout_corr/abs_log_ratio_mean"] for row in rows),
            "abs_max": max(row["rollout_corr/abs_log_ratio_max"] for row in rows),
            "frac_above_1e-2": statistics.fmean(row["rollout_corr/frac_abs_log_ratio_above_1e-2"] for row in rows),
            "steps": len(rows)}


def summarize(runs: list[dict], completions_per_step: int) -> dict:
    """Completions/s over each run's steps (min, median, max over runs), and at the median step of all runs: a
    burst of load from other work on the machine slows a few steps, which the median step leaves out."""
    rates = [run["completions_per_s"] for run in runs]
    median_step = statistics.median(seconds for run in runs for seconds in run["per_step_seconds"])
    summary = {"runs": len(rates), "min": min(rates), "median": statistics.median(rates), "max": max(rates),
               "all": rates, "at_median_step": completions_per_step / median_step}
    if any(run["validation"]["points"] for run in runs):
        summary["time_to"] = {threshold: [run["validation"]["time_to"][threshold] for run in runs]
                              for threshold in runs[0]["validation"]["time_to"]}
        summary["final_score"] = [run["validation"]["points"][-1]["score"] for run in runs]
    return summary


def plot_curves(results: dict[str, list[dict]], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 4))
    colors = {"asyncrl": "tab:blue", "asyncrl, actor.cuda_graphs": "tab:green", "trl": "tab:orange"}
    for system, runs in results.items():
        for index, run in enumerate(runs):
            points = run["validation"]["points"]
            axis.plot([point["train_seconds"] for point in points], [point["score"] for point in points],
                      marker="o", markersize=3, color=colors[system], alpha=0.8,
                      label=f"{system} (GRPO sync, {len(runs)} runs)" if index == 0 else None)
    axis.set_xlabel("training seconds (summed step time: generation, reward, update)")
    axis.set_ylabel("greedy validation accuracy")
    axis.set_title(title, fontsize=9)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="issue")
    parser.add_argument("--runs", type=int, default=3, help="pairs of runs, interleaved asyncrl, TRL, asyncrl, ...")
    parser.add_argument("--order", default=None,
                        help="the runs in order, A = asyncrl and T = TRL, e.g. A,T,A,A (overrides --runs)")
    parser.add_argument("--only", choices=("both", "asyncrl", "trl"), default="both")
    parser.add_argument("--setup-only", action="store_true", help="only make (or reuse) the model and data")
    parser.add_argument("--trl-python", default=str(TRL_VENV_PYTHON),
                        help="python with TRL installed (default: outputs/trl-venv from benchmarks/trl_venv.sh)")
    parser.add_argument("--folder", default=None, help="work folder (default outputs/side_by_side/<workload>)")
    parser.add_argument("--output", default=None,
                        help="result JSON (default outputs/bench/trl_side_by_side_<workload>.json); a PNG of the "
                             "validation curves beside it for learning workloads")
    parser.add_argument("overrides", nargs="*", help="extra asyncrl config overrides (key=value)")
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    workload = WORKLOADS[options.workload]
    folder = Path(options.folder or REPO / "outputs" / "side_by_side" / options.workload).resolve()
    prepare(workload, folder)
    if options.setup_only:
        return 0
    if options.order:
        order = options.order.split(",")
    else:
        pair = {"both": ["A", "T"], "asyncrl": ["A"], "trl": ["T"]}[options.only]
        order = pair * options.runs
    if set(order) - {"A", "T"}:
        raise SystemExit(f"--order takes A and T separated by commas, got {options.order!r}")
    output = Path(options.output or REPO / "outputs" / "bench" / f"trl_side_by_side_{options.workload}.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {"asyncrl": [], "trl": []}
    started = time.monotonic()
    for run in order:
        if run == "A":
            result = run_asyncrl(workload, folder, f"{output.stem}-asyncrl-{len(results['asyncrl'])}",
                                 options.overrides)
            results["asyncrl"].append(result)
            print(f"asyncrl run {len(results['asyncrl']) - 1}: {result['completions_per_s']:.1f} completions/s "
                  f"{result['stages']}; validation {[point['score'] for point in result['validation']['points']]}",
                  flush=True)
        else:
            result = run_trl(folder, options.trl_python)
            results["trl"].append(result)
            print(f"TRL run {len(results['trl']) - 1}: {result['completions_per_s']:.1f} completions/s; validation "
                  f"{[point['score'] for point in result['validation']['points']]}", flush=True)
        write_report(options, workload, results, load_before, time.monotonic() - started, output)
    return 0


def write_report(options: argparse.Namespace, workload: Workload, results: dict[str, list[dict]],
                 load_before: tuple[float, float, float], seconds: float, output: Path) -> None:
    """Written after every run, so a run cut short by a time limit keeps what finished."""
    report = {"workload": options.workload, **dataclasses.asdict(workload), "overrides": options.overrides,
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "seconds": seconds,
              "runs": results, "summary": {system: summarize(runs, workload.rows_per_step)
                                           for system, runs in results.items() if runs}}
    if results["asyncrl"] and results["trl"]:
        report["ratio_of_medians"] = report["summary"]["asyncrl"]["median"] / report["summary"]["trl"]["median"]
    output.write_text(json.dumps(report, indent=1))
    if workload.eval_every:
        plot_curves({system: runs for system, runs in results.items() if runs}, output.with_suffix(".png"),
                    f"{options.workload}: {workload.prompts_per_step} prompts x {workload.n}, lr {workload.lr}")
    for system, summary in report["summary"].items():
        print(f"{system}: median {summary['median']:.1f} completions/s (min {summary['min']:.1f}, max "
              f"{summary['max']:.1f}, {summary['runs']} runs); at the median step {summary['at_median_step']:.1f}",
              flush=True)
    if "ratio_of_medians" in report:
        print(f"asyncrl / TRL: {report['ratio_of_medians']:.2f}x; load average before {load_before}, after "
              f"{report['load_average_after']}; wrote {output}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
