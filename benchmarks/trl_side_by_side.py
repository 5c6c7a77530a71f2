"""asyncrl against TRL's `GRPOTrainer` on a CPU: the same model, prompts, sampling and budget, side by side.

    bash benchmarks/trl_venv.sh                                   # once: TRL 1.16 in outputs/trl-venv
    python benchmarks/trl_side_by_side.py --workload issue --runs 3
    python benchmarks/trl_side_by_side.py --workload demo --runs 3

Each run of a workload is one `asyncrl train` (sync mode, a subprocess, as a user runs it) and one TRL run
(`benchmarks/trl_grpo.py` in TRL's virtual environment), interleaved A, B, A, B, ... so that load from other work
on the machine falls on both alike. Both start from the same random-weight Qwen2-shaped model with the character
tokenizer, on the same arithmetic prompts (asyncrl's chat template, the same token ids on both sides), sample at
temperature 1 with EOS ignored so that every completion is exactly `response_length` tokens, and take one
optimizer step per generation of `prompts_per_step x n` completions in one forward and backward (TRL's
`per_device_train_batch_size` is its micro-batch; asyncrl's `actor.ppo_micro_batch_size_per_gpu` is set to the
same), with fp32 weights, no KL term and AdamW at the same learning rate. Completions/s = completions over the summed wall times of the steps (generation, rewards,
update; asyncrl's weight sync too), start-up excluded. The report gives each side's min and median over the runs,
the machine's load average before and after, and writes everything to `outputs/bench/trl_side_by_side_<workload>.json`.

Workloads:
- `issue`: hidden 256, 4 layers, 4 heads (2 KV), MLP 688 (2.9M parameters); 16 prompts x 8 samples x 64 tokens
  per step, 8 steps.
- `demo`: `asyncrl demo`'s model (hidden 64, 2 layers, 130k parameters), 32 prompts x 8 samples x 4 tokens per step,
  25 steps (random weights: the demo's SFT warm start changes what is learned, not the cost of a step).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from asyncrl.config.schema import DataConfig
from asyncrl.data.dataset import PromptDataset
from asyncrl.data.make import make_task, write_task
from asyncrl.models import build_tiny_model, load_tokenizer

REPO = Path(__file__).resolve().parent.parent
TRL_PYTHON = REPO / "outputs" / "trl-venv" / "bin" / "python"


@dataclass(frozen=True)
class Workload:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    prompts_per_step: int
    n: int
    response_length: int
    steps: int
    lr: float = 1e-6
    seed: int = 0
    threads: int = 2
    task_knobs: tuple[tuple[str, str], ...] = (("min_digits", "2"), ("max_digits", "2"), ("operators", "+"))


WORKLOADS = {
    "issue": Workload(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=688,
                      prompts_per_step=16, n=8, response_length=64, steps=8),
    "demo": Workload(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=256,
                     prompts_per_step=32, n=8, response_length=4, steps=25),
}


def prepare(workload: Workload, folder: Path) -> None:
    """The model, the arithmetic data (parquet, verl's schema) and `prompts.jsonl` (rendered text and ids, in the
    order both trainers will see them is their own business: each shuffles its own way)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = write_task(make_task("arithmetic", dict(workload.task_knobs)), folder / "data",
                       train_size=workload.prompts_per_step * workload.steps * 4, val_size=16, seed=workload.seed)
    model = build_tiny_model(folder / "model", family="qwen2", seed=workload.seed,
                             hidden_size=workload.hidden_size, num_layers=workload.num_layers,
                             num_heads=workload.num_heads, num_kv_heads=workload.num_kv_heads,
                             intermediate_size=workload.intermediate_size, max_position_embeddings=256)
    tokenizer = load_tokenizer(model)
    dataset = PromptDataset.from_files([str(paths["train"])], tokenizer, DataConfig())
    with (folder / "prompts.jsonl").open("w") as out:
        for prompt in dataset.prompts:
            text = tokenizer.decode(prompt.prompt_ids, skip_special_tokens=False)
            out.write(json.dumps({"prompt": text, "prompt_ids": list(prompt.prompt_ids),
                                  "ground_truth": prompt.record.ground_truth}) + "\n")
    (folder / "workload.json").write_text(json.dumps(dataclasses.asdict(workload), indent=1))


def asyncrl_overrides(workload: Workload, folder: Path, run_folder: Path) -> list[str]:
    return [f"model.path={folder / 'model'}", f"data.train_files=[{folder / 'data' / 'train.parquet'}]",
            f"data.train_batch_size={workload.prompts_per_step}", f"data.max_response_length={workload.response_length}",
            f"rollout.n={workload.n}", "rollout.ignore_eos=true", "rollout.temperature=1.0",
            f"actor.ppo_mini_batch_size={workload.prompts_per_step}", f"actor.optim.lr={workload.lr}",
            f"actor.ppo_micro_batch_size_per_gpu={workload.prompts_per_step * workload.n}",
            "algorithm.adv_estimator=grpo", "trainer.mode=sync", "trainer.device=cpu",
            f"trainer.total_steps={workload.steps}", "trainer.val_before_train=false", "trainer.resume=disable",
            "trainer.logger=[jsonl]", f"trainer.output_dir={run_folder}", f"trainer.seed={workload.seed}"]


def run_asyncrl(workload: Workload, folder: Path, index: int, extra: list[str]) -> dict:
    run_folder = folder / f"asyncrl-run-{index}"
    command = [sys.executable, "-m", "asyncrl.cli", "train", *asyncrl_overrides(workload, folder, run_folder), *extra]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if completed.returncode != 0:
        raise RuntimeError(f"asyncrl train failed ({completed.returncode}):\n{completed.stderr[-4000:]}")
    steps = [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]
    steps = [step for step in steps if "timing_s/step" in step]
    step_seconds = sum(step["timing_s/step"] for step in steps)
    completions = workload.prompts_per_step * workload.n * len(steps)
    stages = {key: sum(step.get(key, 0.0) for step in steps)
              for key in ("timing_s/gen", "timing_s/update_actor", "timing_s/sync_weights", "timing_s/reward")}
    return {"system": "asyncrl", "steps": len(steps), "completions": completions, "step_seconds": step_seconds,
            "completions_per_s": completions / step_seconds, "stages": stages,
            "per_step_seconds": [step["timing_s/step"] for step in steps],
            "mean_response_length": [step["response_length/mean"] for step in steps]}


def run_trl(folder: Path) -> dict:
    if not TRL_PYTHON.exists():
        raise RuntimeError(f"{TRL_PYTHON} is missing: run `bash benchmarks/trl_venv.sh` first")
    completed = subprocess.run([str(TRL_PYTHON), str(REPO / "benchmarks" / "trl_grpo.py"), str(folder)],
                               capture_output=True, text=True, cwd=REPO)
    if completed.returncode != 0:
        raise RuntimeError(f"TRL run failed ({completed.returncode}):\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict], completions_per_step: int) -> dict:
    """Completions/s over each run's steps (min, median, max over runs), and at the median step of all runs: a
    burst of load from other work on the machine slows a few steps, which the median step leaves out."""
    rates = [run["completions_per_s"] for run in runs]
    median_step = statistics.median(seconds for run in runs for seconds in run["per_step_seconds"])
    return {"runs": len(rates), "min": min(rates), "median": statistics.median(rates), "max": max(rates),
            "all": rates, "at_median_step": completions_per_step / median_step}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="issue")
    parser.add_argument("--runs", type=int, default=3, help="pairs of runs, interleaved asyncrl, TRL, asyncrl, ...")
    parser.add_argument("--only", choices=("both", "asyncrl", "trl"), default="both")
    parser.add_argument("--folder", default=None, help="work folder (default outputs/side_by_side/<workload>)")
    parser.add_argument("--output", default=None,
                        help="result JSON (default outputs/bench/trl_side_by_side_<workload>.json)")
    parser.add_argument("overrides", nargs="*", help="extra asyncrl config overrides (key=value)")
    options = parser.parse_args(argv)
    workload = WORKLOADS[options.workload]
    folder = Path(options.folder or REPO / "outputs" / "side_by_side" / options.workload).resolve()
    prepare(workload, folder)
    load_before = os.getloadavg()
    results: dict[str, list[dict]] = {"asyncrl": [], "trl": []}
    started = time.monotonic()
    for index in range(options.runs):
        if options.only in ("both", "asyncrl"):
            results["asyncrl"].append(run_asyncrl(workload, folder, index, options.overrides))
            print(f"asyncrl run {index}: {results['asyncrl'][-1]['completions_per_s']:.1f} completions/s "
                  f"{results['asyncrl'][-1]['stages']}", flush=True)
        if options.only in ("both", "trl"):
            results["trl"].append(run_trl(folder))
            print(f"TRL run {index}: {results['trl'][-1]['completions_per_s']:.1f} completions/s", flush=True)
    report = {"workload": options.workload, **dataclasses.asdict(workload), "overrides": options.overrides,
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "seconds": time.monotonic() - started, "runs": results,
              "summary": {system: summarize(runs, workload.prompts_per_step * workload.n)
                          for system, runs in results.items() if runs}}
    if results["asyncrl"] and results["trl"]:
        report["ratio_of_medians"] = report["summary"]["asyncrl"]["median"] / report["summary"]["trl"]["median"]
    output = Path(options.output or REPO / "outputs" / "bench" / f"trl_side_by_side_{options.workload}.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1))
    for system, summary in report["summary"].items():
        print(f"{system}: median {summary['median']:.1f} completions/s (min {summary['min']:.1f}, max "
              f"{summary['max']:.1f}, {summary['runs']} runs); at the median step {summary['at_median_step']:.1f}")
    if "ratio_of_medians" in report:
        print(f"asyncrl / TRL: {report['ratio_of_medians']:.2f}x; load average before {load_before}, after "
              f"{report['load_average_after']}; wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
