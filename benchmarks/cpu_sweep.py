"""The CPU shape sweep: `asyncrl train` against TRL's `GRPOTrainer` and against plain PyTorch, shape by shape.

    bash benchmarks/trl_venv.sh                       # once: TRL 1.16 in outputs/trl-venv
    python benchmarks/cpu_sweep.py                    # every shape x length; a table and outputs/bench/cpu_sweep.json
    python benchmarks/cpu_sweep.py --shapes s1 --lengths 16    # one point

Each point is a model shape (random weights, Qwen2-shaped, the character tokenizer) and a response length (EOS
ignored: every completion is exactly that long). At each point, one after the other in the same minute:
- asyncrl: one `asyncrl train` in sync mode with the side by side's settings (`trl_side_by_side.py`: its prompts,
  sampling, one optimizer step per generation, token-mean loss, no KL), as a user runs it;
- TRL: `GRPOTrainer` on the same folder (`trl_grpo.py`, in TRL's venv);
- plain PyTorch, in this process: a transformers forward + backward + AdamW step on the same number of rows of the
  same length (the update a step needs, with nothing else), and `transformers.generate` of the step's completions
  from the same prompts (sampling, no cache tricks beyond transformers' own KV cache).
Ratios per stage: asyncrl's update (`timing_s/update_actor` per step) over the plain update, asyncrl's generation
(`timing_s/gen` per step) over `generate`, and asyncrl's completions/s over TRL's: over the steps (summed step time)
and over the whole run (the command's wall time, start-up included). Every side runs with OMP_WAIT_POLICY=PASSIVE, the
thread policy of asyncrl's commands. The targets of issue 59: update <= 1x, generation
< 1x, against TRL >= 1.5x over the steps and >= 1.2x over the whole run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

# Every side under the thread policy asyncrl's own commands use (asyncrl/launch/cpu_threads.py; TRL's subprocess
# inherits it): OpenMP threads that sleep while they wait, so a busy neighbour does not make one side spin.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trl_side_by_side import REPO, TRL_VENV_PYTHON, Workload, prepare, run_asyncrl, run_trl  # noqa: E402

# (hidden, layers, heads, KV heads, MLP): about 0.4M, 2.9M, 9.4M and 22M parameters besides the embeddings.
SHAPES = {"s1": (128, 2, 4, 2, 344), "s2": (256, 4, 4, 2, 688), "s3": (384, 6, 6, 2, 1024), "s4": (512, 8, 8, 2, 1376)}
LENGTHS = (16, 64, 256)
PROMPTS_PER_STEP, SAMPLES_PER_PROMPT, STEPS = 8, 4, 3


def workload_of(shape: str, length: int, threads: int) -> Workload:
    hidden, layers, heads, kv_heads, mlp = SHAPES[shape]
    return Workload(hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                    intermediate_size=mlp, prompts_per_step=PROMPTS_PER_STEP, n=SAMPLES_PER_PROMPT,
                    response_length=length, steps=STEPS, threads=threads, max_position_embeddings=length + 64)


def prompt_batch(folder: Path, workload: Workload) -> torch.Tensor:
    """The first step's prompts, each repeated n times, left-padded with id 0: (rows, P) ids and the mask."""
    prompts = [json.loads(line)["prompt_ids"] for line in (folder / "prompts.jsonl").read_text().splitlines()]
    prompts = [ids for ids in prompts[:workload.prompts_per_step] for _ in range(workload.n)]
    width = max(len(ids) for ids in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def timed(function, repeats: int = 2) -> float:
    """Mean seconds of `repeats` calls after one warm-up call."""
    function()
    started = time.monotonic()
    for _ in range(repeats):
        function()
    return (time.monotonic() - started) / repeats


def plain_pytorch(folder: Path, workload: Workload) -> dict[str, float]:
    """Seconds per step of the plain update and of `generate` (see the module doc)."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(workload.threads)
    model = AutoModelForCausalLM.from_pretrained(folder / "model", torch_dtype=torch.float32)
    prompt_ids, prompt_mask = prompt_batch(folder, workload)
    eos = model.generation_config.eos_token_id

    def generate() -> None:
        with torch.no_grad():
            model.generate(prompt_ids, attention_mask=prompt_mask, do_sample=True, temperature=1.0, top_k=0,
                           max_new_tokens=workload.response_length, min_new_tokens=workload.response_length,
                           pad_token_id=0, eos_token_id=eos)

    generator = torch.Generator().manual_seed(0)
    responses = torch.randint(3, model.config.vocab_size, (prompt_ids.shape[0], workload.response_length),
                              generator=generator)
    rows = torch.cat([prompt_ids, responses], dim=1)
    mask = torch.cat([prompt_mask, torch.ones_like(responses)], dim=1)
    advantages = torch.randn(rows.shape[0], generator=generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    micro = workload.micro_rows
    num_prompt = prompt_ids.shape[1]

    def update() -> None:
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, rows.shape[0], micro):
            batch, batch_mask = rows[start:start + micro], mask[start:start + micro]
            logits = model(input_ids=batch, attention_mask=batch_mask).logits[:, num_prompt - 1:-1]
            log_probs = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch[:, num_prompt:, None])[..., 0]
            loss = -(log_probs * advantages[start:start + micro, None]).sum() / responses.numel()
            loss.backward()
        optimizer.step()

    model.train()
    update_s = timed(update)
    model.eval()
    return {"update_s": update_s, "generate_s": timed(generate)}


def point(shape: str, length: int, options: argparse.Namespace) -> dict:
    workload = workload_of(shape, length, options.threads)
    folder = Path(options.folder) / f"{shape}-{length}"
    prepare(workload, folder)
    name = f"sweep-{shape}-{length}"
    asyncrl = run_asyncrl(workload, folder, name, [])
    trl = run_trl(folder, options.trl_python)
    plain = plain_pytorch(folder, workload)
    steps = asyncrl["steps"]
    update_s, gen_s = (asyncrl["stages"][key] / steps for key in ("timing_s/update_actor", "timing_s/gen"))
    completions = workload.rows_per_step * steps
    return {"shape": shape, "length": length, "parameters": parameter_count(folder),
            "asyncrl": {"update_s": update_s, "gen_s": gen_s, "completions_per_s": asyncrl["completions_per_s"],
                        "whole_run_completions_per_s": completions / asyncrl["wall_seconds"]},
            "trl": {"completions_per_s": trl["completions_per_s"],
                    "whole_run_completions_per_s": completions / trl["wall_seconds"]},
            "plain": plain,
            "ratios": {"update_vs_plain": update_s / plain["update_s"], "gen_vs_generate": gen_s / plain["generate_s"],
                       "vs_trl_steps": asyncrl["completions_per_s"] / trl["completions_per_s"],
                       "vs_trl_whole_run": trl["wall_seconds"] / asyncrl["wall_seconds"]},
            "load_average": os.getloadavg()}


def parameter_count(folder: Path) -> int:
    from safetensors import safe_open

    with safe_open(folder / "model" / "model.safetensors", "pt") as handle:
        return sum(handle.get_tensor(key).numel() for key in handle.keys())


def table(points: list[dict]) -> str:
    lines = ["| shape | params | length | update / plain | gen / generate | vs TRL, steps | vs TRL, whole run | "
             "load |", "|---|---|---|---|---|---|---|---|"]
    for entry in points:
        ratios = entry["ratios"]
        lines.append(f"| {entry['shape']} | {entry['parameters'] / 1e6:.1f}M | {entry['length']} | "
                     f"{ratios['update_vs_plain']:.2f}x | {ratios['gen_vs_generate']:.2f}x | "
                     f"{ratios['vs_trl_steps']:.2f}x | {ratios['vs_trl_whole_run']:.2f}x | "
                     f"{entry['load_average'][0]:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS))
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every side")
    parser.add_argument("--trl-python", default=str(TRL_VENV_PYTHON))
    parser.add_argument("--folder", default=str(REPO / "outputs" / "side_by_side" / "sweep"))
    parser.add_argument("--output", default=str(REPO / "outputs" / "bench" / "cpu_sweep.json"))
    options = parser.parse_args(argv)
    output = Path(options.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    points: list[dict] = []
    for shape in options.shapes:
        for length in options.lengths:
            points.append(point(shape, length, options))
            print(table(points[-1:]).splitlines()[-1], flush=True)
            output.write_text(json.dumps({"points": points, "settings": {
                "prompts_per_step": PROMPTS_PER_STEP, "n": SAMPLES_PER_PROMPT, "steps": STEPS,
                "threads": options.threads, "shapes": SHAPES}}, indent=1))
    print(table(points))
    worst = {key: max(entry["ratios"][key] for entry in points) for key in ("update_vs_plain", "gen_vs_generate")}
    print(f"worst update / plain {worst['update_vs_plain']:.2f}x, worst gen / generate "
          f"{worst['gen_vs_generate']:.2f}x; median vs TRL over the steps "
          f"{statistics.median(entry['ratios']['vs_trl_steps'] for entry in points):.2f}x; wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
