"""RewardModel against `transformers`' *ForSequenceClassification: folders it writes, scores it computes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from asyncrl.models import RewardModel, load_model, save_model

from .helpers import right_padded_batch

VOCAB_SIZE, PAD_ID = 97, 0
LENGTHS = [23, 9, 4, 1]
# One folder per family as `save_pretrained` writes it, with the feature that family adds.
HF_CASES = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForSequenceClassification, {}),
    "llama": (transformers.LlamaConfig, transformers.LlamaForSequenceClassification, {"attention_bias": True}),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForSequenceClassification, {"head_dim": 32}),
}


def build_hf_reward_folder(folder: Path, family: str, seed: int = 0, num_labels: int = 1) -> Path:
    """A tiny random *ForSequenceClassification built by transformers from a config (no download), saved."""
    config_class, model_class, extra = HF_CASES[family]
    config = config_class(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                          num_labels=num_labels, pad_token_id=PAD_ID, **extra)
    model = model_class(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # large random weights (norms too), so a misplaced layer or norm shows in the score
        for name, parameter in model.named_parameters():
            noise = torch.randn(tuple(parameter.shape), generator=generator)
            parameter.copy_(1.0 + 0.3 * noise if name.endswith("norm.weight") else 0.2 * noise)
    model.save_pretrained(folder)
    return folder


def _reference(folder: Path) -> torch.nn.Module:
    reference, loading_info = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True)
    assert not loading_info["missing_keys"] and not loading_info["unexpected_keys"], loading_info
    return reference.eval()


@pytest.mark.parametrize("family", list(HF_CASES))
def test_scores_match_transformers_fp32(tmp_path, family):
    folder = build_hf_reward_folder(tmp_path / family, family, seed=len(family))
    ours = load_model(folder, kind="reward")
    reference = _reference(folder)
    assert isinstance(ours, RewardModel)
    assert {name for name, _ in ours.named_parameters()} == {name for name, _ in reference.named_parameters()}
    input_ids, positions, attention_mask = right_padded_batch(LENGTHS, VOCAB_SIZE, seed=3)
    # transformers finds each row's end as its last non-pad token, so real tokens must not be the pad id.
    input_ids = torch.where(attention_mask.bool(), input_ids.clamp(min=PAD_ID + 1), PAD_ID)
    lengths = attention_mask.sum(dim=1)
    with torch.no_grad():
        scores = ours(input_ids, positions, lengths)  # (B,)
        reference_scores = reference(input_ids=input_ids, attention_mask=attention_mask).logits.squeeze(-1)
    assert scores.dtype == torch.float32 and scores.shape == (len(LENGTHS),)
    max_difference = (scores - reference_scores).abs().max().item()
    assert max_difference <= 1e-5, f"{family}: max |ours - transformers| = {max_difference}"
    # Scores of order 1 that differ by row: a head read at the wrong token could not hide under the tolerance.
    assert reference_scores.std().item() > 0.3


def test_the_score_is_read_at_each_rows_last_token(tmp_path):
    model = load_model(build_hf_reward_folder(tmp_path / "rm", "qwen2"), kind="reward")
    input_ids, positions, _ = right_padded_batch([8], VOCAB_SIZE, seed=4)
    padded = torch.cat([input_ids, torch.full((1, 5), 7)], dim=1)  # 5 trailing tokens that are not the pad id
    with torch.no_grad():
        alone = model(input_ids, positions, torch.tensor([8]))
        with_tail = model(padded, torch.arange(13)[None], torch.tensor([8]))
        full = model(padded, torch.arange(13)[None], torch.tensor([13]))
    assert torch.allclose(alone, with_tail, atol=1e-6)  # causal: what follows the end cannot change the score
    assert (alone - full).abs().item() > 1e-3


def test_save_model_writes_a_folder_transformers_loads(tmp_path):
    ours = load_model(build_hf_reward_folder(tmp_path / "rm", "llama"), kind="reward")
    save_model(ours, tmp_path / "copy")
    config = json.loads((tmp_path / "copy" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and config["id2label"] == {"0": "LABEL_0"}
    reference = _reference(tmp_path / "copy")
    input_ids, positions, attention_mask = right_padded_batch([6, 3], VOCAB_SIZE, seed=5)
    input_ids = torch.where(attention_mask.bool(), input_ids.clamp(min=PAD_ID + 1), PAD_ID)
    with torch.no_grad():
        scores = ours(input_ids, positions, attention_mask.sum(dim=1))
        reference_scores = reference(input_ids=input_ids, attention_mask=attention_mask).logits.squeeze(-1)
    assert (scores - reference_scores).abs().max().item() <= 1e-5


def test_kind_mismatches_and_several_labels_are_named(tmp_path, family_folders):
    reward_folder = build_hf_reward_folder(tmp_path / "rm", "qwen2")
    with pytest.raises(ValueError, match=r"holds a reward model \(\*ForSequenceClassification\); cannot load it as a "
                                         r"causal LM"):
        load_model(reward_folder)
    with pytest.raises(ValueError, match=r"holds a causal LM \(\*ForCausalLM\); cannot load it as a reward model"):
        load_model(family_folders["qwen2_bias_tied"], kind="reward")
    classifier = build_hf_reward_folder(tmp_path / "classifier", "qwen2", num_labels=3)
    with pytest.raises(ValueError, match=r"config.json: a reward model has one output .* got num_labels=3"):
        load_model(classifier, kind="reward")


def test_lengths_out_of_range_are_rejected(tmp_path):
    model = load_model(build_hf_reward_folder(tmp_path / "rm", "qwen2"), kind="reward")
    input_ids, positions, _ = right_padded_batch([4, 4], VOCAB_SIZE)
    for lengths in (torch.tensor([4, 0]), torch.tensor([5, 4]), torch.tensor([4])):
        with pytest.raises(ValueError, match=r"lengths must be \(B,\) = \(2,\)"):
            model(input_ids, positions, lengths)
