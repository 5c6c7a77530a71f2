"""Our Qwen3-MoE and Mixtral against `transformers`' classes: logits on a padded batch, both ways of the
checkpoint (their save loads in ours, ours loads in theirs), configs, and the value/reward heads' names."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors import safe_open

from asyncrl.models import load_model, save_model
from .helpers import right_padded_batch
from .moe_helpers import MOE_CASES, build_transformers_moe

LENGTHS = [23, 11, 4, 1]


@pytest.fixture(scope="module")
def moe_folders(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("moe")
    return {case: build_transformers_moe(root / case, case, seed=index) for index, case in enumerate(MOE_CASES)}


def max_valid_difference(ours, reference, attention_mask) -> tuple[float, float]:
    input_ids, positions, _ = right_padded_batch(LENGTHS, ours.config.vocab_size, seed=3)
    with torch.no_grad():
        logits = ours.compute_logits(ours(input_ids, positions))
        reference_logits = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    valid = attention_mask.bool()
    return (logits[valid] - reference_logits[valid]).abs().max().item(), reference_logits[valid].std().item()


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_logits_match_transformers_and_export_loads_there(moe_folders, case, tmp_path):
    folder = moe_folders[case]
    ours = load_model(folder)
    assert ours.config.model_type == MOE_CASES[case]["family"] and ours.config.num_experts == 4
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    _, _, attention_mask = right_padded_batch(LENGTHS, ours.config.vocab_size, seed=3)
    difference, spread = max_valid_difference(ours, reference, attention_mask)
    assert difference <= 1e-5, f"{case}: max |ours - transformers| = {difference}"
    assert spread > 0.3  # logits of order 1: a wrong expert or weight could not hide under the tolerance

    save_model(ours, tmp_path / "export")
    reloaded, loading_info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "export", dtype=torch.float32, output_loading_info=True)
    assert not loading_info["missing_keys"] and not loading_info["unexpected_keys"], loading_info
    difference, _ = max_valid_difference(ours, reloaded.eval(), attention_mask)
    assert difference <= 1e-5, f"{case}: exported folder in transformers differs by {difference}"
    # The export holds exactly the tensor names transformers itself writes (the hub's per-expert names).
    with safe_open(str(folder / "model.safetensors"), "pt") as theirs, \
            safe_open(str(tmp_path / "export" / "model.safetensors"), "pt") as exported:
        assert set(exported.keys()) == set(theirs.keys())


@pytest.mark.parametrize("case", list(MOE_CASES))
def test_transformers_config_equals_ours(moe_folders, case, tmp_path):
    ours = load_model(moe_folders[case])
    save_model(ours, tmp_path / "export")
    theirs = transformers.AutoConfig.from_pretrained(tmp_path / "export")
    assert theirs.model_type == ours.config.model_type
    assert theirs.num_local_experts == ours.config.num_experts  # both families alias num_experts to it
    assert theirs.num_experts_per_tok == ours.config.num_experts_per_tok
    assert theirs.router_aux_loss_coef == ours.config.router_aux_loss_coef
    if ours.config.model_type == "qwen3_moe":
        assert theirs.moe_intermediate_size == ours.config.moe_intermediate_size
        assert theirs.norm_topk_prob == ours.config.norm_topk_prob
        assert json.loads((tmp_path / "export" / "config.json").read_text())["num_experts"] == 4  # the hub's key
    else:
        assert theirs.intermediate_size == ours.config.moe_intermediate_size


def test_value_and_reward_heads_load_in_transformers(moe_folders, tmp_path):
    for kind, auto_class in (("value", transformers.AutoModelForTokenClassification),
                             ("reward", None)):
        if auto_class is None:
            continue
        critic = load_model(moe_folders["mixtral"], kind=kind)
        save_model(critic, tmp_path / kind)
        reference, loading_info = auto_class.from_pretrained(tmp_path / kind, dtype=torch.float32,
                                                             output_loading_info=True)
        assert not loading_info["missing_keys"] and not loading_info["unexpected_keys"], loading_info
        input_ids, positions, attention_mask = right_padded_batch(LENGTHS, critic.config.vocab_size, seed=4)
        with torch.no_grad():
            values = critic(input_ids, positions)
            reference_values = reference.eval()(input_ids=input_ids, attention_mask=attention_mask).logits[..., 0]
        valid = attention_mask.bool()
        assert (values[valid] - reference_values[valid]).abs().max().item() <= 1e-5


def test_unsupported_moe_configs_name_the_key(moe_folders, tmp_path):
    from asyncrl.models import TransformerConfig
    hf = json.loads((moe_folders["qwen3_moe_raw_topk"] / "config.json").read_text())
    with pytest.raises(ValueError, match="mlp_only_layers"):
        TransformerConfig.from_hf_dict({**hf, "mlp_only_layers": [1]}, "x/config.json")
    hf = json.loads((moe_folders["mixtral"] / "config.json").read_text())
    with pytest.raises(ValueError, match="router_jitter_noise"):
        TransformerConfig.from_hf_dict({**hf, "router_jitter_noise": 0.1}, "x/config.json")
    with pytest.raises(ValueError, match="sliding_window"):
        TransformerConfig.from_hf_dict({**hf, "sliding_window": 4096}, "x/config.json")
    with pytest.raises(ValueError, match="num_experts_per_tok must be at most num_experts"):
        TransformerConfig.from_hf_dict({**hf, "num_experts_per_tok": 5}, "x/config.json")


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_tiny_moe_builders_load_in_transformers(family, tmp_path):
    from asyncrl.models import build_tiny_model
    folder = build_tiny_model(tmp_path / family, family=family, hidden_size=32, num_layers=2, init_std=0.2)
    ours = load_model(folder)
    assert ours.config.is_moe and ours.config.num_experts == 4 and ours.config.num_experts_per_tok == 2
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    _, _, attention_mask = right_padded_batch(LENGTHS, ours.config.vocab_size, seed=3)
    difference, spread = max_valid_difference(ours, reference, attention_mask)
    assert difference <= 1e-5 and spread > 0.1
