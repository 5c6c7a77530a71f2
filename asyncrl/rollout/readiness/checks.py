"""What RL needs of a rollout server, each a named check that passes or fails with its evidence. They run in the
order registered: the sampling checks on the weights the server holds (--model), then the reload checks, which
load a changed copy of them and then the original back.

    result = SERVER_CHECKS["seeds"](under)      # CheckResult(name, passed, evidence)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from asyncrl.registry import Entry, Registry
from asyncrl.rollout.external_client import ServerFailure, ServerRequestError
from asyncrl.rollout.external_weights import folder_checksum
from asyncrl.rollout.readiness.probe import Sample, ServerUnderCheck

ATTEMPTS = 5   # of the abort, and of the reload during requests, until one lands while requests run
CHANGED_VERSION, ORIGINAL_VERSION = 1, 0      # the versions the reloads stamp (a run's first sync sets its own)


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    evidence: str


SERVER_CHECKS: Registry[Entry] = Registry("server check", Entry)


def span(values: list[int]) -> str:
    return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"


@SERVER_CHECKS.register("token_ids", summary="completions return the sampled token ids: integers in the vocabulary, "
                                             "exactly max_tokens of them with ignore_eos, as many log-probs, the "
                                             "prompt (special ids inside) echoed as sent")
def token_ids(under: ServerUnderCheck) -> CheckResult:
    under.samples = [under.complete(seed) for seed in range(under.settings.num_samples)]
    vocab_size, budget = under.reference.vocab_size, under.max_tokens
    problems = []
    for sample in under.samples:
        if sample.error:
            problems.append(f"seed {sample.seed}: {sample.error}")
        elif not isinstance(sample.ids, list) or not all(isinstance(i, int) for i in sample.ids):
            problems.append(f"seed {sample.seed}: token_ids is {str(sample.ids)[:60]}, not a list of integers")
        elif any(not 0 <= i < vocab_size for i in sample.ids):
            problems.append(f"seed {sample.seed}: ids outside [0, {vocab_size})")
        elif len(sample.ids) != budget:
            problems.append(f"seed {sample.seed}: {len(sample.ids)} ids for max_tokens={budget} with ignore_eos "
                            f"(finish {sample.finish_reason!r}): ids rebuilt from text lose special tokens")
        elif not isinstance(sample.log_probs, list) or len(sample.log_probs) != len(sample.ids):
            problems.append(f"seed {sample.seed}: {len(sample.log_probs or [])} log-probs for {len(sample.ids)} ids")
        elif sample.prompt_echo is not None and sample.prompt_echo != under.prompt:
            problems.append(f"seed {sample.seed}: prompt_token_ids {sample.prompt_echo} differ from the prompt sent "
                            f"{under.prompt}")
    if problems:
        return CheckResult("token_ids", False, "; ".join(problems))
    echoed = all(sample.prompt_echo is not None for sample in under.samples)
    return CheckResult("token_ids", True, f"{len(under.samples)} completions of exactly {budget} ids (ignore_eos), "
                                          f"ids in [0, {vocab_size}), as many log-probs; the prompt with special "
                                          f"ids {under.reference.special_ids[:2]} inside "
                                          f"{'echoed as sent' if echoed else '(not echoed by the server)'}")


@SERVER_CHECKS.register("logprobs_temperature", summary="each token's log-prob is the one under softmax(logits / "
                                                        "temperature) of the weights served, as the trainer computes "
                                                        "it (within the tolerance)")
def logprobs_temperature(under: ServerUnderCheck) -> CheckResult:
    usable = [sample for sample in under.samples if sample.is_usable()]
    if not usable:
        return CheckResult("logprobs_temperature", False, f"no completion to compare: "
                                                          f"{under.samples[0].problem() if under.samples else 'none'}")
    temperature, tolerance = under.settings.temperature, under.settings.tolerance
    worst = max(float(under.differences(sample, under.reference).max()) for sample in usable)
    raw = max(float(np.abs(np.asarray(sample.log_probs) - under.reference.log_probs(
        under.prompt, sample.ids, 1.0)).max()) for sample in usable)
    tokens = sum(len(sample.ids) for sample in usable)
    evidence = (f"max |server - asyncrl| = {worst:.2e} over {tokens} tokens at temperature {temperature} "
                f"(tolerance {tolerance:g}; against temperature 1: {raw:.2e})")
    if worst <= tolerance:
        return CheckResult("logprobs_temperature", True, evidence)
    if raw <= tolerance:
        evidence += ("; the server reports log-probs at temperature 1, not those it sampled from (vLLM: "
                     "--logprobs-mode processed_logprobs)")
    return CheckResult("logprobs_temperature", False, evidence)


@SERVER_CHECKS.register("seeds", summary="a request repeated with its seed samples the same ids and log-probs; "
                                         "other seeds sample other ids")
def seeds(under: ServerUnderCheck) -> CheckResult:
    first = under.samples[0] if under.samples else under.complete(0)
    again = under.complete(first.seed)
    if not (first.is_usable() and again.is_usable()):
        return CheckResult("seeds", False, f"no completions to compare: {first.problem() or again.problem()}")
    same_ids = again.ids == first.ids
    gap = float(np.abs(np.asarray(first.log_probs) - np.asarray(again.log_probs)).max())
    distinct = len({tuple(sample.ids) for sample in under.samples if sample.is_usable()})
    passed = same_ids and gap <= under.settings.tolerance and distinct > 1
    evidence = (f"seed {first.seed} twice: {'the same' if same_ids else 'different'} {len(first.ids)} ids, "
                f"log-probs within {gap:.1e}; {distinct} distinct responses from {len(under.samples)} seeds")
    return CheckResult("seeds", passed, evidence)


@SERVER_CHECKS.register("abort", summary="aborting every request returns each one's tokens so far (finish_reason "
                                         "abort, log-probs intact) at once; none errs or hangs")
def abort(under: ServerUnderCheck) -> CheckResult:
    for attempt in range(ATTEMPTS):
        samples, error = under.complete_around(lambda: under.api.abort_all(under.server, under.settings.timeout_s),
                                               100 + 100 * attempt)
        if error:
            return CheckResult("abort", False, f"the abort failed: {error}")
        failed = [sample for sample in samples if not sample.is_usable()]
        if failed:
            return CheckResult("abort", False, f"{len(failed)} of {len(samples)} requests broke on the abort: "
                                               f"{failed[0].problem()}")
        aborted = [sample for sample in samples if sample.finish_reason == "abort"]
        if aborted:
            break
    else:
        return CheckResult("abort", False, f"every request ran to its {under.max_tokens} tokens in "
                                           f"{ATTEMPTS} attempts: the abort did not stop any")
    gap = max((float(under.differences(sample, under.reference).max()) for sample in aborted if sample.ids),
              default=0.0)
    passed = all(len(sample.ids) < under.max_tokens for sample in aborted) and gap <= under.settings.tolerance
    return CheckResult("abort", passed, f"{len(samples)} requests of {under.max_tokens} tokens sent one after "
                                        f"another, abort in their midst: {len(aborted)} returned finish 'abort' with "
                                        f"{span([len(sample.ids) for sample in aborted])} tokens, log-probs within "
                                        f"{gap:.1e} of asyncrl's")


@SERVER_CHECKS.register("reload_changes_weights", summary="after a reload of other weights from an HF folder the "
                                                          "server samples from them: its log-probs equal the new "
                                                          "weights' and differ from the old")
def reload_changes_weights(under: ServerUnderCheck) -> CheckResult:
    try:
        under.reload(under.changed, CHANGED_VERSION)
    except (ServerFailure, ServerRequestError) as error:
        return CheckResult("reload_changes_weights", False, f"the reload of {under.changed.folder} failed: {error}")
    sample = under.complete(0)
    if not sample.is_usable():
        return CheckResult("reload_changes_weights", False, f"no completion to compare after the reload: "
                                                            f"{sample.problem()}")
    new = float(under.differences(sample, under.changed).max())
    old = float(under.differences(sample, under.reference).max())
    tolerance = under.settings.tolerance
    passed = new <= tolerance < old
    evidence = (f"after reloading {under.changed.folder.name}: max |server - new weights| = {new:.2e}, "
                f"|server - old weights| = {old:.2e} (tolerance {tolerance:g})")
    if not passed and old <= tolerance:
        evidence += "; the server still samples from the old weights"
    return CheckResult("reload_changes_weights", passed, evidence)


@SERVER_CHECKS.register("checksum_after_reload", summary="the server's weights checksum after the reload equals "
                                                         "the reloaded folder's")
def checksum_after_reload(under: ServerUnderCheck) -> CheckResult:
    try:
        answer = under.api.checksum(under.server, under.settings.timeout_s)
    except (ServerFailure, ServerRequestError) as error:
        return CheckResult("checksum_after_reload", False, f"no checksum: {error}")
    dtype = getattr(torch, answer.dtype)
    expected, before = folder_checksum(under.changed.folder, dtype), folder_checksum(under.reference.folder, dtype)
    if answer.sha256 == expected:
        return CheckResult("checksum_after_reload", True, f"sha256 {answer.sha256[:12]}... ({answer.dtype}) equals "
                                                          f"the reloaded folder's (before: {before[:12]}...)")
    what = "the weights before the reload (stale)" if answer.sha256 == before else "neither folder"
    return CheckResult("checksum_after_reload", False, f"sha256 {answer.sha256[:12]}... is {what}'s, not the "
                                                       f"reloaded folder's {expected[:12]}...")


@SERVER_CHECKS.register("request_during_reload", summary="requests in flight during a reload complete; each token "
                                                         "was sampled by the old weights up to a point, where the "
                                                         "server's token_versions (if it stamps them) change; the "
                                                         "server then serves the new weights")
def request_during_reload(under: ServerUnderCheck) -> CheckResult:
    for attempt in range(ATTEMPTS):
        try:
            if attempt:
                under.reload(under.changed, CHANGED_VERSION)
        except (ServerFailure, ServerRequestError) as error:
            return CheckResult("request_during_reload", False, f"the reload failed: {error}")
        samples, error = under.complete_around(lambda: under.reload(under.reference, ORIGINAL_VERSION),
                                               1000 + 100 * attempt)
        if error:
            return CheckResult("request_during_reload", False, f"the reload during requests failed: {error}")
        broken = [sample for sample in samples if not sample.is_usable() or len(sample.ids) != under.max_tokens]
        if broken:
            why = broken[0].problem() or f"{len(broken[0].ids)} of {under.max_tokens} tokens"
            return CheckResult("request_during_reload", False, f"{len(broken)} of {len(samples)} requests in flight "
                                                               f"broke: {why}")
        switches = [switch_point(under, sample) for sample in samples]
        # A token stamped with the old version must have been sampled by the old weights (the first token after
        # the switch may match them by chance: the reverse is not checked).
        misstamped = [switch for switch in switches if switch.stamped_at is not None and
                      switch.stamped_at > switch.num_old]
        if misstamped:
            return CheckResult("request_during_reload", False, f"token_versions stamp the first "
                                                               f"{misstamped[0].stamped_at} tokens with the old "
                                                               f"version, but the old weights sampled only the first "
                                                               f"{misstamped[0].num_old}")
        spanning = [switch for switch in switches if 0 < switch.num_old < under.max_tokens]
        if spanning:
            break
    else:
        return CheckResult("request_during_reload", False, f"no request was in flight when the reload landed in "
                                                           f"{ATTEMPTS} attempts: not exercised")
    after = under.complete(0)
    serves_new = after.is_usable() and float(under.differences(after, under.reference).max()) <= \
        under.settings.tolerance
    evidence = (f"{len(spanning)} of {len(samples)} requests spanned the reload: "
                f"{span([switch.num_old for switch in spanning])} tokens on the old weights, then "
                f"{span([switch.num_mixed for switch in spanning])} on the new weights over the old keys and values "
                f"and {span([switch.num_new for switch in spanning])} on the new weights alone"
                f"{'; token_versions agree' if spanning[0].stamped_at is not None else ''}"
                f"; a request after it "
                f"{'samples from the new weights' if serves_new else 'does NOT sample from them'}")
    return CheckResult("request_during_reload", serves_new, evidence)


@dataclass(frozen=True)
class Switch:
    """Where a request in flight during a reload went from the old weights to the new."""
    num_old: int     # leading tokens sampled by the old weights
    num_mixed: int   # then tokens that neither weights alone sampled (the new over keys and values the old computed)
    num_new: int     # then tokens the new weights alone sampled (their keys and values recomputed)
    stamped_at: int | None   # where the server's token_versions change (None: it does not stamp them)


def switch_point(under: ServerUnderCheck, sample: Sample) -> Switch:
    """The sample's switch: its leading run of tokens from the old weights, then what sampled the rest. After the
    run a token of the new weights over the old keys and values can match either weights alone by chance; it
    counts as mixed unless it matches the new weights."""
    tolerance = under.settings.tolerance
    on_old = under.differences(sample, under.changed) <= tolerance
    on_new = under.differences(sample, under.reference) <= tolerance
    num_old = int(np.argmin(on_old)) if not on_old.all() else len(on_old)
    num_new = int(on_new[num_old:].sum())
    versions = sample.versions
    stamped_at = None
    if isinstance(versions, list) and versions and all(isinstance(version, int) for version in versions):
        stamped_at = next((index for index, version in enumerate(versions) if version != versions[0]), len(versions))
        if versions[0] != CHANGED_VERSION:
            stamped_at = 0
    return Switch(num_old, len(on_old) - num_old - num_new, num_new, stamped_at)
