"""What a bring-your-own agent costs per completion: the same job with and without `rollout.agent.path`.

    python benchmarks/byo_overhead.py --steps 10 --out outputs/byo_overhead     # about 2 minutes on 2 cores

Both runs train the demo's warm-started model on the demo's task in sync mode for `--steps` steps of the same
prompts (same seeds), without validation. The built-in run generates each prompt's `rollout.n` responses as
one batch in the engine; the agent run gives each sample to an agent that asks the same model for one chat
completion through the recording endpoint (`openai` client -> HTTP -> the endpoint -> the engine) and scores
it as the built-in scorer does (exact match): the same completions, one HTTP round trip each. The overhead per
completion is the difference of the two runs' generation time (`timing_s/gen`, summed over the steps) over
the completions. With `--profile` (needs `pip install yappi`: the endpoint and the agents run on an event loop
thread of the driver, which cProfile does not see) the agent run's driver is profiled over all its threads, and
the functions that took the most of its CPU time are listed in the JSON: where the time goes.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.launch import train
from asyncrl.launch.demo import demo_config_path, prepare_setup
from asyncrl.telemetry import read_metrics

AGENT = '''
async def rollout(client, sample):
    model = (await client.models.list()).data[0].id
    reply = await client.chat.completions.create(model=model, messages=list(sample.messages))
    return float(reply.choices[0].message.content.strip() == sample.ground_truth)
'''


def run(out: Path, name: str, overrides: list[str], profile: bool) -> dict:
    setup = prepare_setup(out, "arithmetic")
    config = load_config(demo_config_path(), [
        f"model.path={setup.model}", f"data.train_files=[{setup.train_file}]", "data.val_files=[]",
        "trainer.val_before_train=false", f"trainer.output_dir={out / name}", "trainer.logger=[jsonl]",
        "trainer.resume=disable", *overrides])
    if profile:
        import yappi   # optional: only --profile needs it
        yappi.set_clock_type("cpu")
        yappi.start()
    started = time.monotonic()
    summary = train(config)
    rows = [row for row in read_metrics(out / name / "metrics.jsonl") if "timing_s/gen" in row]
    result = {"wall_s": time.monotonic() - started, "rl_s": summary["wall_time_s"], "steps": summary["steps"],
              "completions": summary["samples"], "gen_s": sum(row["timing_s/gen"] for row in rows),
              "step_s": sum(row["timing_s/step"] for row in rows),
              "score_first_last": [rows[0]["critic/score/mean"], rows[-1]["critic/score/mean"]]}
    if profile:
        yappi.stop()
        text = io.StringIO()
        yappi.get_func_stats().sort("tsub").print_all(out=text, columns={0: ("name", 90), 1: ("ncall", 10),
                                                                          2: ("tsub", 8), 3: ("ttot", 8)})
        result["driver_cpu_profile_by_own_time"] = text.getvalue().splitlines()[:40]
        result["driver_cpu_s"] = sum(stat.tsub for stat in yappi.get_func_stats())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="outputs/byo_overhead")
    parser.add_argument("--result", default=None, help="the JSON file (default OUT/byo_overhead.json)")
    parser.add_argument("--profile", action="store_true", help="profile the agent run's driver")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="for both runs")
    options = parser.parse_args()
    out = Path(options.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    agent = out / "one_completion_agent.py"
    agent.write_text(AGENT)
    common = [f"trainer.total_steps={options.steps}", *options.overrides]
    load_before = os.getloadavg()[0]
    builtin = run(out, "builtin", common, profile=False)
    with_agent = run(out, "agent", [*common, f"rollout.agent.path={agent}:rollout"], options.profile)
    completions = with_agent["completions"]
    record = {"command": "python benchmarks/byo_overhead.py " + " ".join(
                  [f"--steps {options.steps}", *(["--profile"] if options.profile else []), *options.overrides]),
              "machine": f"{os.cpu_count()} CPUs, load average {load_before:.1f} before and "
                         f"{os.getloadavg()[0]:.1f} after, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}",
              "date": time.strftime("%Y-%m-%d"), "builtin": builtin, "agent": with_agent,
              "overhead_ms_per_completion": 1000 * (with_agent["gen_s"] - builtin["gen_s"]) / completions,
              "agent_over_builtin_step_time": with_agent["step_s"] / builtin["step_s"]}
    result = Path(options.result or out / "byo_overhead.json")
    result.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({key: value for key, value in record.items() if key not in ("builtin", "agent")}, indent=1))
    print(f"wrote {result}")


if __name__ == "__main__":
    main()
