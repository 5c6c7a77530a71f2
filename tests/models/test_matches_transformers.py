"""Our transformer against `transformers` on the same HF folder: logits, configs, value heads."""

from __future__ import annotations

import pytest
import torch
import transformers

from asyncrl.models import ValueModel, load_model, save_model
from asyncrl.models.rope import compute_inv_freq
from .helpers import FAMILY_CASES, right_padded_batch

LENGTHS = [37, 20, 5, 1]  # positions up to 36 reach every llama3 frequency band of the scaled case


@pytest.mark.parametrize("case", list(FAMILY_CASES))
def test_logits_match_transformers_fp32(family_folders, case):
    folder = family_folders[case]
    ours = load_model(folder)
    reference, loading_info = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, output_loading_info=True)
    reference.eval()
    # transformers would silently initialise a tensor our file lacks: the names must match exactly.
    assert not loading_info["missing_keys"] and not loading_info["unexpected_keys"], loading_info
    ours_names = {name for name, _ in ours.named_parameters()}
    assert ours_names == {name for name, _ in reference.named_parameters()}
    input_ids, positions, attention_mask = right_padded_batch(LENGTHS, ours.config.vocab_size, seed=1)
    with torch.no_grad():
        logits = ours.compute_logits(ours(input_ids, positions))  # (B, T, V)
        reference_logits = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    assert logits.dtype == torch.float32
    assert logits.shape == reference_logits.shape == (len(LENGTHS), max(LENGTHS), ours.config.vocab_size)
    valid = attention_mask.bool()
    max_difference = (logits[valid] - reference_logits[valid]).abs().max().item()
    assert max_difference <= 1e-5, f"{case}: max |ours - transformers| = {max_difference}"
    # Random weights with std 0.2 give logits of order 1: a wrong layer could not hide under the tolerance.
    assert reference_logits[valid].std().item() > 0.3


def test_llama3_scaling_changes_frequencies(family_folders):
    config = load_model(family_folders["llama3_scaled_untied"]).config
    scaled = compute_inv_freq(config)
    unscaled = compute_inv_freq(type(config)(**{**config.__dict__, "rope_scaling": None}))
    assert scaled[0] == unscaled[0]  # short wavelength: kept
    assert torch.isclose(scaled[-1], unscaled[-1] / 8.0)  # long wavelength: divided by factor
    assert unscaled[1] / 8.0 < scaled[1] < unscaled[1]  # between the bands: interpolated


@pytest.mark.parametrize("case", list(FAMILY_CASES))
def test_transformers_config_equals_ours(family_folders, case):
    folder = family_folders[case]
    ours = load_model(folder).config
    theirs = transformers.AutoConfig.from_pretrained(folder)
    assert theirs.model_type == ours.model_type
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings",
                "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(theirs, key) == getattr(ours, key), key
    assert getattr(theirs, "head_dim", theirs.hidden_size // theirs.num_attention_heads) == ours.head_dim
    assert theirs.rope_parameters["rope_theta"] == ours.rope_theta
    if ours.rope_scaling is None:
        assert theirs.rope_parameters["rope_type"] == "default"
    else:
        for key, value in ours.rope_scaling.items():
            assert theirs.rope_parameters[key] == value, key
    if ours.model_type != "qwen2":  # Qwen2 has no attention_bias key: its q/k/v bias is unconditional
        assert theirs.attention_bias == ours.attention_bias
    if ours.model_type != "llama":
        assert theirs.layer_types == ["full_attention"] * ours.num_hidden_layers


def test_value_model_matches_transformers_token_classification(family_folders, tmp_path):
    critic = load_model(family_folders["qwen3_qk_norm"], kind="value")
    with torch.no_grad():
        critic.score.bias.fill_(0.25)  # a nonzero bias, so a dropped bias would show
    save_model(critic, tmp_path / "critic")
    reference, loading_info = transformers.AutoModelForTokenClassification.from_pretrained(
        tmp_path / "critic", dtype=torch.float32, output_loading_info=True)
    reference.eval()
    assert not loading_info["missing_keys"] and not loading_info["unexpected_keys"], loading_info
    input_ids, positions, attention_mask = right_padded_batch(LENGTHS, critic.config.vocab_size, seed=2)
    with torch.no_grad():
        values = critic(input_ids, positions)  # (B, T)
        reference_values = reference(input_ids=input_ids, attention_mask=attention_mask).logits.squeeze(-1)
    valid = attention_mask.bool()
    assert values.shape == input_ids.shape
    assert (values[valid] - reference_values[valid]).abs().max().item() <= 1e-5
    assert isinstance(critic, ValueModel)
