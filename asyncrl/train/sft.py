"""Supervised warm start: train a policy on a dataset's reference answers before RL.

    asyncrl sft --model tiny/ --data data/train.parquet --out sft/ --epochs 2 --lr 3e-3

The reference answer of a row is `extra_info.answer` when present, else `reward_model.ground_truth`
(when it is a string). The loss is the mean negative log-likelihood of the answer tokens plus EOS, after
the chat-templated prompt. One process; the result is an HF folder that RL starts from. On a GPU
(`--device cuda`) the masters stay fp32 and the forward and backward compute in bf16 (autocast), as the RL
trainer does; on the CPU everything is fp32.

A row whose `extra_info.trace` holds a multi-turn trace (a JSON list of assistant and tool messages, as the
tool task writes) is learned as the agent loop will generate it: each assistant turn (its content, its
`<tool_call>` blocks, EOS) trains; the tool turns between them, rendered by the same chat template, are
context with loss mask 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from asyncrl.config.schema import DataConfig
from asyncrl.data.chat_template import encode_prompt
from asyncrl.data.reader import DatasetError, read_prompt_files
from asyncrl.data.records import PromptRecord
from asyncrl.models import load_model, load_tokenizer, save_model
from asyncrl.train.batch import TrainBatch
from asyncrl.train.forward import response_log_probs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTSettings:
    epochs: float = 1.0            # fractional epochs stop part-way through the last one
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    seed: int = 0
    device: str = "cpu"
    # Batches of examples of similar length (HF's group_by_length): a batch pads to its longest example, so with
    # long-tailed answers random batches spend most of their tokens on padding.
    group_by_length: bool = False


def reference_answer(record: PromptRecord) -> str:
    if "answer" in record.extra_info:
        return str(record.extra_info["answer"])
    if isinstance(record.ground_truth, str):
        return record.ground_truth
    raise DatasetError(f"{record.prompt_id}: no reference answer for SFT (extra_info.answer or a string "
                       f"reward_model.ground_truth)")


def tokenize_examples(records: list[PromptRecord], tokenizer,
                      eos_id: int) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, response ids, response loss mask) per record."""
    examples = []
    for record in records:
        prompt_ids = encode_prompt(tokenizer, record.messages)
        if "trace" in record.extra_info:
            examples.append((prompt_ids, *tokenize_trace(record, tokenizer)))
            continue
        answer_ids = list(tokenizer.encode(reference_answer(record), add_special_tokens=False)) + [eos_id]
        examples.append((prompt_ids, answer_ids, [1] * len(answer_ids)))
    return examples


def tokenize_trace(record: PromptRecord, tokenizer) -> tuple[list[int], list[int]]:
    """The trace's ids after the prompt, and their mask (1 on assistant turns, 0 on tool turns): each piece is
    the difference between renders of the conversation up to it, so the ids are the template's own."""
    trace = json.loads(record.extra_info["trace"])
    conversation = list(record.messages)
    previous = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    ids: list[int] = []
    mask: list[int] = []
    for index, message in enumerate(trace):
        conversation.append(message)
        is_model = message["role"] == "assistant"
        if not is_model and index + 1 < len(trace) and trace[index + 1]["role"] == "tool":
            continue   # consecutive tool results share one turn
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=not is_model, tokenize=False)
        if not text.startswith(previous):
            raise DatasetError(f"{record.prompt_id}: the chat template renders earlier turns differently once "
                               f"message {index} of extra_info.trace follows; it cannot be learned token-exactly")
        piece = list(tokenizer.encode(text[len(previous):], add_special_tokens=False))
        ids += piece
        mask += [int(is_model)] * len(piece)
        previous = text
    return ids, mask


def epoch_order(lengths: list[int], batch_size: int, group_by_length: bool,
                generator: torch.Generator) -> torch.Tensor:
    """An epoch's order of the examples; consecutive `batch_size` slices are its batches. Grouped by length: a
    random order is cut into pools of 64 batches, each pool sorted by length, and the batches shuffled, so a batch
    holds examples of similar length while the epoch stays random."""
    order = torch.randperm(len(lengths), generator=generator)
    if not group_by_length:
        return order
    pool = 64 * batch_size
    lengths_tensor = torch.tensor(lengths)
    pieces = []
    for start in range(0, len(order), pool):
        chunk = order[start:start + pool]
        pieces.append(chunk[torch.argsort(lengths_tensor[chunk], descending=True, stable=True)])
    grouped = torch.cat(pieces)
    batches = list(grouped.split(batch_size))
    # A short last batch stays last, so the epoch's consecutive slices are these batches.
    full = len(batches) - (len(batches[-1]) < batch_size)
    shuffled = torch.randperm(full, generator=generator).tolist() + list(range(full, len(batches)))
    return torch.cat([batches[index] for index in shuffled])


def run_sft(model_path: str | Path, data_files: list[str], output_dir: str | Path, settings: SFTSettings) -> Path:
    """Train and save; returns the output folder."""
    torch.manual_seed(settings.seed)
    device = torch.device(settings.device)
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path, dtype=torch.float32, device=device)
    # bf16 compute on a GPU, as the RL trainer's mixed precision: fp32 products would cost several times more.
    compute = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    examples = tokenize_examples(read_prompt_files(data_files, DataConfig().prompt_key), tokenizer,
                                 model.config.eos_token_ids[0])
    steps_per_epoch = math.ceil(len(examples) / settings.batch_size)
    total_steps = max(1, int(settings.epochs * steps_per_epoch))
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / settings.warmup_steps)
                                                 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total_steps))))
    generator = torch.Generator().manual_seed(settings.seed)
    model.train()
    lengths = [len(prompt) + len(answer) for prompt, answer, _ in examples]
    order = epoch_order(lengths, settings.batch_size, settings.group_by_length, generator)
    for step in range(total_steps):
        position = (step % steps_per_epoch) * settings.batch_size
        if position == 0 and step:
            order = epoch_order(lengths, settings.batch_size, settings.group_by_length, generator)
        chosen = [examples[index] for index in order[position:position + settings.batch_size].tolist()]
        batch = TrainBatch.from_sequences([prompt for prompt, _, _ in chosen], [answer for _, answer, _ in chosen],
                                          list(range(len(chosen))))
        mask = torch.zeros_like(batch.response_mask)
        for row, (_, _, answer_mask) in enumerate(chosen):
            mask[row, :len(answer_mask)] = torch.tensor(answer_mask, dtype=mask.dtype)
        batch = batch.replace(response_mask=mask).to(device)
        with compute:
            log_probs, _ = response_log_probs(model, batch, temperature=1.0, with_entropy=False)
        loss = -(log_probs * batch.response_mask).sum() / batch.response_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 50 == 0 or step == total_steps - 1:
            logger.info("sft step %d/%d loss %.4f", step + 1, total_steps, loss.item())
    return save_model(model, output_dir, tokenizer_folder=model_path)
