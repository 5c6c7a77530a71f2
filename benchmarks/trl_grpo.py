"""TRL's side of the side by side: `GRPOTrainer` on a folder that `trl_side_by_side.py prepare` wrote.

    outputs/trl-venv/bin/python benchmarks/trl_grpo.py outputs/side_by_side/issue     # prints one JSON line

Runs in TRL's own virtual environment (`benchmarks/trl_venv.sh`), so it imports nothing from asyncrl. The folder
holds the model (an HF folder with the character tokenizer), `prompts.jsonl` (each prompt's text as asyncrl's
chat template rendered it, and its token ids, checked here against this tokenizer's) and `workload.json`
(prompts per step, samples per prompt, tokens per sample, steps, learning rate, threads).

The settings a user would write for this workload, with two defaults of TRL 1.16 changed because asyncrl's CPU run
does not use them either: `bf16=False` (fp32 on both sides) and `gradient_checkpointing=False`. One generation of
`prompts x n` completions feeds one optimizer step (`per_device_train_batch_size = prompts x n`,
`steps_per_generation=1`, `num_iterations=1`), generation is transformers' `generate` (no vLLM), and every completion
is exactly `response_length` tokens: EOS is suppressed until then (`min_new_tokens`), as asyncrl's
`rollout.ignore_eos` does. Time is measured as asyncrl measures its steps: from each step's start to its end
(generation, rewards, the update), summed over the steps; start-up is excluded.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (generation included: GRPOTrainer generates inside the step)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.step_seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_seconds.append(time.perf_counter() - self.started)


def exact_answer(completions: list[str], ground_truth: list[str], **kwargs) -> list[float]:
    """1 when the completion, cut at the first end-of-text, is the answer (asyncrl's arithmetic scorer)."""
    return [float(completion.split("<|endoftext|>")[0].strip() == answer)
            for completion, answer in zip(completions, ground_truth)]


def load_prompts(folder: Path, tokenizer: PreTrainedTokenizerFast) -> Dataset:
    rows = [json.loads(line) for line in (folder / "prompts.jsonl").read_text().splitlines()]
    for index, row in enumerate(rows):
        ids = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        if ids != row["prompt_ids"]:
            raise ValueError(f"{folder / 'prompts.jsonl'} row {index}: TRL's tokenizer gives {ids}, asyncrl gave "
                             f"{row['prompt_ids']}")
    return Dataset.from_list([{"prompt": row["prompt"], "ground_truth": row["ground_truth"]} for row in rows])


def run(folder: Path) -> dict:
    workload = json.loads((folder / "workload.json").read_text())
    torch.set_num_threads(workload["threads"])
    model_folder = folder / "model"
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(model_folder / "tokenizer.json"),
                                        eos_token="<|endoftext|>", pad_token="<|pad|>")
    tokenizer.padding_side = "left"
    dataset = load_prompts(folder, tokenizer)
    rows_per_step = workload["prompts_per_step"] * workload["n"]
    config = GRPOConfig(
        output_dir=str(folder / "trl-run"), use_cpu=True, bf16=False, gradient_checkpointing=False,
        per_device_train_batch_size=rows_per_step, gradient_accumulation_steps=1, steps_per_generation=1,
        num_iterations=1, num_generations=workload["n"], max_completion_length=workload["response_length"],
        generation_kwargs={"min_new_tokens": workload["response_length"]}, temperature=1.0, top_p=1.0,
        learning_rate=workload["lr"], max_steps=workload["steps"], logging_steps=1, save_strategy="no",
        report_to="none", seed=workload["seed"], dataloader_num_workers=0, disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_folder), dtype=torch.float32)
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=exact_answer, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    started = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - started
    lengths = [entry["completions/mean_length"] for entry in trainer.state.log_history
               if "completions/mean_length" in entry]
    step_seconds = sum(timer.step_seconds)
    num_completions = rows_per_step * len(timer.step_seconds)
    return {"system": "trl", "steps": len(timer.step_seconds), "completions": num_completions,
            "step_seconds": step_seconds, "train_seconds": train_seconds,
            "completions_per_s": num_completions / step_seconds, "mean_completion_length": lengths,
            "per_step_seconds": timer.step_seconds}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: trl_grpo.py FOLDER   (a folder written by trl_side_by_side.py prepare)")
    print(json.dumps(run(Path(sys.argv[1]))))
