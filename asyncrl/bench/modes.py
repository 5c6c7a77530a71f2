"""Mode against mode: the same model, devices, data and sample budget through every training mode.

    asyncrl bench modes                                   # CPU, tiny model, long-tail lengths, all modes
    asyncrl bench modes --device cuda --model qwen2.5-0.5b --samples 8192 --lengths lognormal:512:4096
    asyncrl bench modes --modes sync fully_async_partial --samples 1024
    asyncrl bench modes --task tools --tool-latency lognormal:0.5:4   # agents: tool calls with a latency tail

The default (tiny model on CPU, 2,048 samples per mode, five modes) takes about 5 minutes on 2 cores: the
bench prints its plan and an estimate first, and after each mode the time it took and what is left.

Each mode is a real training run (`asyncrl.launch.train`) with responses of long-tail lengths
(per-request budgets drawn from `--lengths`, `rollout.ignore_eos=true`). Writes into `--results-dir`
(default `outputs/bench/modes/` under the current directory, git-ignored in a checkout; the runs themselves
live in a temporary folder removed at the end) `modes_<name>.json`, a markdown table (printed
too) and PNGs: throughput per mode and, per mode, the timeline showing what overlapped. Rewards are the
arithmetic task's (speed runs on random weights score ~0; learning is compared on the demo task, see
docs/benchmarks.md).

`--task tools` runs the tools demo's task instead (docs/agents.md): its warm-started model (the demo's setup,
cached in `<results-dir>/setup/`), real EOS, multi-turn trajectories whose calculator calls wait a delay drawn
from `--tool-latency`. There the speed-up comes from generating other trajectories while one waits for its
tool, and the final scores say whether the modes reached equal accuracy.

Devices: `sync` uses every device as a colocated trainer rank; the separated modes split them
(--rollout-devices for the rollout, the rest for the trainer). On CPU a "device" is a share of the cores.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncrl.bench.models import write_random_model
from asyncrl.bench.results import default_output
from asyncrl.config import load_config
from asyncrl.data.make import make_task, write_task
from asyncrl.launch import train
from asyncrl.data.demo_tasks import DEMO_TASKS
from asyncrl.launch.demo import prepare_setup
from asyncrl.models import build_tiny_model
from asyncrl.telemetry import plot_bars, plot_timeline, read_metrics

MODES = {
    "sync": ["trainer.mode=sync"],
    "one_step_off": ["trainer.mode=one_step_off"],
    "fully_async": ["trainer.mode=fully_async", "async_training.trigger_parameter_sync_step=2",
                    "async_training.staleness_threshold=0"],
    "fully_async_stale": ["trainer.mode=fully_async", "async_training.trigger_parameter_sync_step=2",
                          "async_training.staleness_threshold=0.5"],
    "fully_async_partial": ["trainer.mode=fully_async", "async_training.trigger_parameter_sync_step=2",
                            "async_training.staleness_threshold=0.5", "async_training.partial_rollout=true"],
}
TIMINGS = ("gen", "old_log_prob", "update_actor", "sync_weights", "step")
# The up-front estimate for the tiny model on CPU: a run's start-up (Ray, actors, the final save and export)
# and its samples per second over the steps, as the default workload measured on 2 cores (sync ~130 samples/s;
# the async modes faster). Other workloads are estimated once their first mode has finished.
CPU_TINY_STARTUP_S = 20.0
CPU_TINY_SAMPLES_PER_S = 100.0


# The tiny CPU models: 4 heads of 16 dimensions, or 2 of 32 (vLLM's CPU attention runs 32 and up).
TINY_HEADS = {"tiny": 4, "tiny32": 2}


def prepare(root: Path, model: str, device: str, prompts: int) -> tuple[Path, Path, Path]:
    data = write_task(make_task("arithmetic"), root / "data", prompts, 16, seed=0)
    if model in TINY_HEADS:
        folder = build_tiny_model(root / "model", family="qwen2", seed=0, hidden_size=64, num_layers=2,
                                  num_heads=TINY_HEADS[model], num_kv_heads=TINY_HEADS[model] // 2,
                                  max_position_embeddings=512)
    else:
        # Prompts are character-tokenised; their ids are valid in any vocabulary.
        folder = write_random_model(model, root / "model", with_char_tokenizer=True)
    return folder, data["train"], data["val"]


def tool_workload(results_dir: Path, root: Path, latency: str) -> tuple[Path, Path, Path, list[str]]:
    """The tools demo's warm model and data, and the overrides of a multi-turn run whose calculator waits
    `latency` per call."""
    setup = prepare_setup(results_dir / "setup", "tools")
    tools = root / "tools.yaml"
    tools.write_text(f"tools:\n  - class_name: calculator\n    config: {{latency: \"{latency}\", timeout_s: 60}}\n")
    overrides = [override for override in DEMO_TASKS["tools"].overrides
                 if not override.startswith(("rollout.multi_turn.tool_config_path", "trainer.test_freq", "rollout.n=",
                                             "actor.ppo_mini_batch_size", "data.val_batch_size", "trainer.total_steps",
                                             "data.train_batch_size"))]
    return setup.model, setup.train_file, setup.val_file, [*overrides, f"rollout.multi_turn.tool_config_path={tools}",
                                                          "rollout.ignore_eos=false", "rollout.length_distribution=",
                                                          "trainer.test_freq=-1"]


def mode_config(mode: str, folder: Path, train_file: Path, val_file: Path, output: Path,
                options: argparse.Namespace, workload: tuple[str, ...] = ()) -> Any:
    separated = mode != "sync" or options.rollout_backend == "vllm"
    devices = options.devices
    trainer_devices = devices - options.rollout_devices if separated else devices
    prompts_per_step = options.prompts_per_step
    return load_config(None, [
        f"model.path={folder}", f"data.train_files=[{train_file}]", f"data.val_files=[{val_file}]",
        f"trainer.output_dir={output}",
        f"trainer.device={options.device}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.save_freq=-1", f"trainer.n_gpus_per_node={trainer_devices}",
        f"rollout.n_gpus_per_node={options.rollout_devices}", f"rollout.n={options.n}",
        f"data.train_batch_size={prompts_per_step}", f"actor.ppo_mini_batch_size={prompts_per_step // 2}",
        "async_training.require_batches=2", f"data.max_response_length={options.max_response_length}",
        "data.max_prompt_length=32", "rollout.ignore_eos=true", f'rollout.length_distribution="{options.lengths}"',
        f"trainer.total_steps={options.samples // (options.n * prompts_per_step)}", "actor.optim.lr=1e-5",
        f"actor.ppo_micro_batch_size_per_gpu={options.micro_batch}", "ray.rpc_timeout_s=900",
        *workload, *backend_overrides(mode, options.rollout_backend), *options.overrides, *MODES[mode]])


def backend_overrides(mode: str, backend: str) -> list[str]:
    """Where a mode generates: sync in the trainer ranks (colocated) unless the backend runs only on devices of its
    own (vLLM: then sync's replicas get the rollout devices as the separated modes do); auto = the mode's default."""
    if backend == "auto" or (mode == "sync" and backend == "ray_replicas"):
        return []
    return [f"rollout.backend={backend}"]


def summarize(mode: str, output: Path, wall_s: float) -> dict[str, Any]:
    rows = [row for row in read_metrics(output / "metrics.jsonl") if "critic/score/mean" in row]
    summary = json.loads((output / "summary.json").read_text())
    mean = lambda key: sum(row.get(key, 0.0) for row in rows) / max(len(rows), 1)  # noqa: E731
    steps_s = sum(row["timing_s/step"] for row in rows)
    final_score = summary["final_validation"]["val/score/mean"]  # 16 validation prompts, after training
    # Throughput is over the training steps (the first one included: a pipeline fills there), not over the
    # actors' start-up and the final checkpoint and export, which cost the same in every mode and would
    # dilute the comparison of a short run.
    result = {"mode": mode, "steps": len(rows), "samples": summary["samples"], "tokens": summary["tokens"],
              "wall_s": wall_s, "train_s": summary["wall_time_s"], "steps_s": steps_s,
              "samples_per_s": summary["samples"] / steps_s, "tokens_per_s": summary["tokens"] / steps_s,
              "end_to_end_samples_per_s": summary["samples"] / summary["wall_time_s"],
              "final_score": final_score,
              "staleness_mean": mean("staleness/mean"), "staleness_max": max(row.get("staleness/max", 0) for row in rows),
              "trainer_idle_ratio": mean("trainer/idle_ratio") if mode.startswith("fully")
              else mean("timing_s/gen") / max(mean("timing_s/step"), 1e-9),
              "rollouter_idle_ratio": mean("rollouter/idle_ratio") if mode.startswith("fully") else None}
    result.update({f"{name}_s": mean(f"timing_s/{name}") for name in TIMINGS})
    result["logprob_agreement"] = logprob_agreement(rows)
    result["prefill"] = prefill_totals(rows)
    return result


def prefill_totals(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Prefill tokens asked for and computed over the run, and the prefix cache's share (None where the backend
    does not count them)."""
    rows = [row for row in rows if "rollout/prefill_tokens_requested" in row]
    if not rows:
        return None
    requested = sum(row["rollout/prefill_tokens_requested"] for row in rows)
    computed = sum(row["rollout/prefill_tokens_computed"] for row in rows)
    return {"requested": requested, "computed": computed, "hit_rate": 1 - computed / requested,
            "preempted_fraction": max(row["rollout/preempted_fraction"] for row in rows)}


def logprob_agreement(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Rollout against trainer log-probs on the same tokens over the run (decoupled mode reports them:
    `algorithm.rollout_correction.bypass_mode=false`), or None."""
    rows = [row for row in rows if "rollout_corr/abs_log_ratio_mean" in row]
    if not rows:
        return None
    return {"abs_mean": sum(row["rollout_corr/abs_log_ratio_mean"] for row in rows) / len(rows),
            "abs_max": max(row["rollout_corr/abs_log_ratio_max"] for row in rows),
            "frac_above_1e-2": sum(row["rollout_corr/frac_abs_log_ratio_above_1e-2"] for row in rows) / len(rows),
            "k3_kl": sum(row["rollout_corr/k3_kl"] for row in rows) / len(rows), "steps": len(rows)}


def markdown_table(results: list[dict[str, Any]]) -> str:
    base = next((result for result in results if result["mode"] == "sync"), results[0])
    lines = ["| mode | samples/s | tokens/s | speed-up vs sync | end-to-end samples/s | step s | gen/wait s | "
             "old log-prob s | update s | sync s | trainer idle | rollouter idle | staleness mean / max | final score |",
             "|" + "---|" * 14]
    for result in results:
        rollouter = f"{result['rollouter_idle_ratio']:.2f}" if result["rollouter_idle_ratio"] is not None else "-"
        lines.append(
            f"| {result['mode']} | {result['samples_per_s']:.1f} | {result['tokens_per_s']:.0f} | "
            f"{result['samples_per_s'] / base['samples_per_s']:.2f}x | {result['end_to_end_samples_per_s']:.1f} | "
            f"{result['step_s']:.3f} | {result['gen_s']:.3f} | "
            f"{result['old_log_prob_s']:.3f} | {result['update_actor_s']:.3f} | {result['sync_weights_s']:.3f} | "
            f"{result['trainer_idle_ratio']:.2f} | {rollouter} | {result['staleness_mean']:.2f} / "
            f"{result['staleness_max']:.0f} | {result['final_score']:.3f} |")
    return "\n".join(lines)


def plan(options: argparse.Namespace) -> str:
    """What the bench is about to run, and how long that should take when it can say."""
    steps = options.samples // (options.n * options.prompts_per_step)
    runs = "training run" if len(options.modes) == 1 else "training runs"
    text = (f"[bench modes] {len(options.modes)} {runs} ({', '.join(options.modes)}), each {options.samples} "
            f"samples in {steps} steps on {options.devices} {options.device} devices")
    if options.device == "cpu" and options.model in TINY_HEADS:
        estimate_s = len(options.modes) * (CPU_TINY_STARTUP_S + options.samples / CPU_TINY_SAMPLES_PER_S)
        return text + f": about {format_minutes(estimate_s)} on 2 cores (a busy machine takes longer)"
    return text + ": the time left is estimated once the first run has finished"


def format_minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def run_modes_benchmark(options: argparse.Namespace) -> list[dict[str, Any]]:
    print(plan(options), flush=True)
    results_dir = Path(options.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="asyncrl-modes-") as temporary:
        root = Path(temporary)
        workload: list[str] = []
        if options.task == "tools":
            folder, train_file, val_file, workload = tool_workload(results_dir, root, options.tool_latency)
        else:
            folder, train_file, val_file = prepare(root, options.model, options.device,
                                                   options.samples // options.n + 64)
        for index, mode in enumerate(options.modes, start=1):
            print(f"[bench modes] {index}/{len(options.modes)} {mode} ...", flush=True)
            output = root / mode
            started = time.monotonic()
            train(mode_config(mode, folder, train_file, val_file, output, options, tuple(workload)))
            results.append(summarize(mode, output, time.monotonic() - started))
            plot_timeline(output / "timeline.json", results_dir / f"modes_{options.name}_timeline_{mode}.png")
            average_s = sum(result["wall_s"] for result in results) / len(results)
            left = len(options.modes) - index
            print(f"[bench modes] {index}/{len(options.modes)} {mode}: {results[-1]['samples_per_s']:.1f} samples/s, "
                  f"{results[-1]['wall_s']:.0f} s" + (f"; about {format_minutes(left * average_s)} left" if left else ""),
                  flush=True)
    plot_bars({result["mode"]: result["samples_per_s"] for result in results}, f"throughput ({options.name})",
              "samples / s", results_dir / f"modes_{options.name}_throughput.png")
    table = markdown_table(results)
    (results_dir / f"modes_{options.name}.md").write_text(table + "\n")
    (results_dir / f"modes_{options.name}.json").write_text(json.dumps(
        {"options": vars(options), "results": results}, indent=1, default=str))
    print(table)
    print(f"wrote modes_{options.name}.json, .md and plots to {results_dir.resolve()}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncrl bench modes", description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--devices", type=int, default=2, help="devices in all (CPU: core shares)")
    parser.add_argument("--rollout-devices", type=int, default=1, help="of which the separated modes' rollout")
    parser.add_argument("--model", default="tiny", help="tiny, tiny32 (heads of 32 dimensions, for vLLM on CPU), "
                                                        "qwen2.5-0.5b or qwen2.5-1.5b")
    parser.add_argument("--rollout-backend", default="auto", choices=["auto", "ray_replicas", "vllm"],
                        help="the rollout engine: auto = each mode's default (asyncrl's engine), vllm = vLLM replicas "
                             "(docs/vllm.md; on CPU with --model tiny32)")
    parser.add_argument("--samples", type=int, default=2048, help="responses per mode (the sample budget)")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--lengths", default="lognormal:24:192:1.0", help="per-request response-length budgets")
    parser.add_argument("--max-response-length", type=int, default=192)
    parser.add_argument("--task", default="arithmetic", choices=["arithmetic", "tools"],
                        help="arithmetic: long-tail lengths on random weights; tools: the tools demo's multi-turn task")
    parser.add_argument("--tool-latency", default="lognormal:0.5:4",
                        help="--task tools: each calculator call's delay (seconds: 'S', 'LOW:HIGH', 'lognormal:MEDIAN:CAP')")
    parser.add_argument("--name", default="cpu")
    parser.add_argument("--results-dir", default=default_output("modes"),
                        help="folder for the JSON, the table and the plots (default outputs/bench/modes)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for every mode")
    options = parser.parse_args(argv)
    run_modes_benchmark(options)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
