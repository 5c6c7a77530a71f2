"""The `reward` section of the config tree (reward functions, overlong shaping, reward models and judges);
`schema.py` assembles the tree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from asyncrl.config.fields import option, section
from asyncrl.config.limits import MAX_MEMORY_MB, MAX_WAIT_S


@dataclass
class OverlongBufferConfig:
    enable: bool = option(
        False, "DAPO's soft overlong punishment: a training response longer than data.max_response_length - len "
               "tokens gets (length - (data.max_response_length - len)) / len x penalty_factor subtracted from its "
               "reward, penalty_factor at the full budget (every mode; validation scores are not shaped)")
    len: int = option(0, "the buffer: how many of the last tokens of data.max_response_length are penalised, "
                         "linearly (0 < len <= data.max_response_length when enabled)", ge=0)
    penalty_factor: float = option(1.0, "the penalty of a response that uses the whole token budget", ge=0.0)


# The judge's user message when reward.model.prompt_template is not set.
DEFAULT_JUDGE_TEMPLATE = ("Question: {prompt}\nReference answer: {ground_truth}\nResponse: {response}\n"
                          "Is the response correct? Answer 1 for yes, 0 for no.")


@dataclass
class RewardModelConfig:
    enable: bool = option(
        False, "score every response with a reward model too (Ray actors, in every mode), combined with the rule "
               "score as reward.model.combine says; verl's reward_model.enable")
    kind: Literal["discriminative", "generative"] = option(
        "discriminative", "discriminative = an HF *ForSequenceClassification folder with one label (what "
                          "AutoModelForSequenceClassification.save_pretrained writes), scored at the last token of "
                          "the prompt and response in its tokenizer's chat template; generative = a causal LM judge "
                          "that answers reward.model.prompt_template greedily on our engine, its answer read by "
                          "reward.model.answer_parser")
    path: str = option("", "HF folder of the reward model or judge, with its own tokenizer files (required when "
                           "enabled); verl's reward_model.model.path")
    weight: float = option(1.0, "factor on the model's score before it is combined with the rule score")
    combine: Literal["sum", "model_only", "rule_if_model_failed"] = option(
        "sum", "sum = rule score + weight x model score; model_only = weight x model score (the rule score is "
               "still computed and logged as reward/rule/mean); rule_if_model_failed = weight x model score, or "
               "the rule score where the model's call failed. A failed call's model score is 0 either way")
    num_workers: int = option(1, "reward-model actors; each scoring call's batch is split among them", gt=0)
    num_cpus_per_worker: float = option(0.1, "CPUs Ray reserves for each actor (a fraction on CPU)", gt=0.0)
    num_gpus_per_worker: float = option(
        0.0, "GPU share of each actor: 1 = a device of its own, a fraction to share one the trainer and rollout "
             "pools do not hold; 0 runs the model on CPU", ge=0.0, le=1.0)
    micro_batch_size_per_gpu: int = option(
        16, "samples per forward pass of a discriminative model (a judge generates its whole share at once)", gt=0)
    max_length: Optional[int] = option(
        None, "tokens of a discriminative model's input (a longer one keeps its last tokens, where the score is "
              "read) and of a judge's prompt (a longer one scores 0 as an error); null = the model's "
              "max_position_embeddings", gt=1)
    timeout_s: float = option(
        60.0, "limit on one scoring call to the actors; the samples of an actor past it score 0 as timeouts "
              "(reward/model_timeouts) and the actor is restarted", gt=0.0, le=MAX_WAIT_S)
    prompt_template: str = option(
        DEFAULT_JUDGE_TEMPLATE, "generative: the judge's user message; {prompt} (the prompt's user text), "
                                "{response} and {ground_truth} are filled in (write {{ and }} for braces)")
    answer_parser: str = option(
        "number", "generative: how the judge's answer becomes a score: number (the first number in it), yes_no "
                  "(yes -> 1, no -> 0), or 'path/to/file.py:function' taking the answer text and returning a "
                  "number (None: unparsable). An unparsable answer scores 0 and counts in reward/model_errors")
    max_new_tokens: int = option(16, "generative: token budget of the judge's greedy answer", gt=0)


@dataclass
class RewardConfig:
    custom_function: str = option(
        "", "user scorer 'path/to/file.py:function' or 'package.module:function'; empty = built-in "
            "scorer chosen by each row's data_source")
    timeout_s: float = option(10.0, "per-sample time limit; a scorer past it scores 0 and is counted", gt=0.0,
                              le=MAX_WAIT_S)
    num_workers: int = option(1, "scoring processes (capped at 4 per CPU, with a warning)", gt=0)
    import_timeout_s: float = option(
        120.0, "time a scoring process may take to import the reward function; a file that hangs, exits or "
               "raises at import fails the run before Ray starts, naming the file", gt=0.0, le=MAX_WAIT_S)
    max_batch_s: Optional[float] = option(
        None, "cap on one scoring call over a batch, counted from when a scoring process is ready; samples "
              "left at the cap score 0 as timeouts; null = none",
        gt=0.0, le=MAX_WAIT_S)
    max_memory_mb: Optional[int] = option(
        None, "memory limit of each scoring process (Linux); a scorer past it scores 0 and is counted; "
              "null = none", gt=0, le=MAX_MEMORY_MB)
    max_cpu_s: Optional[int] = option(
        None, "CPU seconds a scoring process may spend on one sample (Linux); past it the process is "
              "replaced and the sample scores 0; null = none", gt=0, le=int(MAX_WAIT_S))
    overlong_buffer: OverlongBufferConfig = section(
        OverlongBufferConfig, "reward shaping of responses that approach the token budget (DAPO)")
    model: RewardModelConfig = section(
        RewardModelConfig, "a discriminative reward model or a generative judge, combined with the rule score")
