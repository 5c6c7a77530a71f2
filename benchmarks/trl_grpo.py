"""TRL's side of the side by side: `GRPOTrainer` on a folder that `trl_side_by_side.py` prepared.

    outputs/trl-venv/bin/python benchmarks/trl_grpo.py outputs/side_by_side/issue     # prints one JSON line

Runs in a python that has TRL (on a CPU machine its own virtual environment, `benchmarks/trl_venv.sh`), and imports
nothing from asyncrl. The folder holds the model (an HF folder with the character tokenizer), `prompts.jsonl` (each
prompt's text as asyncrl's chat template rendered it, and its token ids, checked here against this tokenizer's),
`val_prompts.jsonl` (the same for the validation problems) and `workload.json` (prompts per step, samples per
prompt, tokens per sample, steps, learning rate, device, micro-batch rows, validation cadence, threads).

The settings a user would write for the workload, with TRL 1.16's defaults kept where they match asyncrl's run
(`loss_type="dapo"`: token-mean over the batch; `scale_rewards="group"`; `beta=0`; `epsilon=0.2`) and changed where
they would not: the learning rate is constant (TRL's default decays linearly to 0 over the steps, asyncrl's stays
constant), and on a CPU `bf16=False` and `gradient_checkpointing=False` (asyncrl's CPU run has neither; on a GPU
both sides compute in bf16 with fp32 weights). One generation of `prompts x n` completions feeds one optimizer step
(`per_device_train_batch_size` x `gradient_accumulation_steps` = `prompts x n`, `steps_per_generation` = the
accumulation steps, `num_iterations=1`); generation is transformers' `generate` (no vLLM, TRL's default). Where the
workload ignores EOS, every completion is exactly `response_length` tokens: EOS is suppressed until then
(`min_new_tokens`), as asyncrl's `rollout.ignore_eos` does. Time is measured as asyncrl measures its steps: from
each step's start to its end (generation, rewards, the update), summed over the steps; start-up and validation are
excluded. Validation is greedy `generate` on the validation prompts, scored by the rule asyncrl's arithmetic task
uses (the first integer of the completion must be the answer).
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

EOS_TOKEN = "<|endoftext|>"
INTEGER = re.compile(r"-?\d+")


def first_integer_is(completion: str, answer: str) -> float:
    """asyncrl's arithmetic rule: 1 when the first integer of the completion (cut at EOS) is the answer."""
    match = INTEGER.search(completion.split(EOS_TOKEN)[0])
    return float(match is not None and match.group() == str(answer).strip())


def exact_answer(completions: list[str], ground_truth: list[str], **kwargs) -> list[float]:
    return [first_integer_is(completion, answer) for completion, answer in zip(completions, ground_truth)]


class StepTimerAndValidation(TrainerCallback):
    """Wall time of every optimizer step (generation included: GRPOTrainer generates inside the step), then, every
    `eval_every` steps and before the first, greedy validation outside the timed step."""

    def __init__(self, validate, eval_every: int) -> None:
        self.validate = validate
        self.eval_every = eval_every
        self.started = 0.0
        self.step_seconds: list[float] = []
        self.validation_scores: list[tuple[int, float]] = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.eval_every:
            self.validation_scores.append((0, self.validate(model)))

    def on_step_begin(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.step_seconds.append(time.perf_counter() - self.started)
        step = len(self.step_seconds)
        if self.eval_every and (step % self.eval_every == 0 or step == args.max_steps):
            self.validation_scores.append((step, self.validate(model)))


def load_prompts(path: Path, tokenizer: PreTrainedTokenizerFast) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for index, row in enumerate(rows):
        ids = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        if ids != row["prompt_ids"]:
            raise ValueError(f"{path} row {index}: TRL's tokenizer gives {ids}, asyncrl gave {row['prompt_ids']}")
    return rows


def greedy_validation(tokenizer: PreTrainedTokenizerFast, rows: list[dict], max_new_tokens: int, device: str):
    """A function of the model: the fraction of validation prompts whose greedy completion is right."""
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext())

    @torch.no_grad()
    def validate(model) -> float:
        was_training = model.training
        model.eval()
        correct = 0.0
        for start in range(0, len(rows), 256):
            chunk = rows[start:start + 256]
            encoded = tokenizer([row["prompt"] for row in chunk], add_special_tokens=False, padding=True,
                                return_tensors="pt").to(model.device)
            with autocast:
                output = model.generate(**encoded, do_sample=False, max_new_tokens=max_new_tokens,
                                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1]:], skip_special_tokens=False)
            correct += sum(first_integer_is(text, row["ground_truth"]) for text, row in zip(texts, chunk))
        model.train(was_training)
        return correct / len(rows)

    return validate


def run(folder: Path) -> dict:
    workload = json.loads((folder / "workload.json").read_text())
    torch.set_num_threads(workload["threads"])
    on_gpu = workload["device"] == "cuda"
    model_folder = folder / "model"
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(model_folder / "tokenizer.json"),
                                        eos_token=EOS_TOKEN, pad_token="<|pad|>")
    tokenizer.padding_side = "left"
    prompts = load_prompts(folder / "prompts.jsonl", tokenizer)
    dataset = Dataset.from_list([{"prompt": row["prompt"], "ground_truth": row["ground_truth"]} for row in prompts])
    rows_per_step = workload["prompts_per_step"] * workload["n"]
    micro_rows = workload["micro_batch_rows"] or rows_per_step
    accumulation = rows_per_step // micro_rows
    generation = {"min_new_tokens": workload["response_length"]} if workload["ignore_eos"] else {}
    config = GRPOConfig(
        output_dir=str(folder / "trl-run"), use_cpu=not on_gpu, bf16=on_gpu, gradient_checkpointing=False,
        per_device_train_batch_size=micro_rows, gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation, num_iterations=1, num_generations=workload["n"],
        max_completion_length=workload["response_length"], generation_kwargs=generation,
        temperature=workload["temperature"], top_p=1.0, learning_rate=workload["lr"], lr_scheduler_type="constant",
        weight_decay=0.0, max_steps=workload["steps"], logging_steps=1, save_strategy="no", report_to="none",
        seed=workload["seed"], dataloader_num_workers=0, disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_folder), dtype=torch.float32)
    validate = greedy_validation(tokenizer, load_prompts(folder / "val_prompts.jsonl", tokenizer),
                                 workload["response_length"], workload["device"])
    callback = StepTimerAndValidation(validate, workload["eval_every"])
    trainer = GRPOTrainer(model=model, reward_funcs=exact_answer, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[callback])
    started = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - started
    logs = trainer.state.log_history
    step_seconds = sum(callback.step_seconds)
    num_completions = rows_per_step * len(callback.step_seconds)
    return {"system": "trl", "steps": len(callback.step_seconds), "completions": num_completions,
            "step_seconds": step_seconds, "train_seconds": train_seconds,
            "completions_per_s": num_completions / step_seconds,
            "mean_completion_length": [entry["completions/mean_length"] for entry in logs
                                       if "completions/mean_length" in entry],
            "training_score": [entry["reward"] for entry in logs if "reward" in entry],
            "per_step_seconds": callback.step_seconds, "validation_scores": callback.validation_scores,
            "device": torch.cuda.get_device_name() if on_gpu else "cpu", "torch": torch.__version__}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: trl_grpo.py FOLDER   (a folder prepared by trl_side_by_side.py)")
    print(json.dumps(run(Path(sys.argv[1]))))
