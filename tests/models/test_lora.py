"""LoRA adapters in the shared transformer: which parameters train, the disabled-adapter reference, the
engine's fused projections, merging, and PEFT's names and numbers."""

from __future__ import annotations

import pytest
import torch
import transformers

from asyncrl.models import build_tiny_model, fuse_projections, load_model
from asyncrl.models.lora import (PROJECTIONS, LoRALinear, LoRASpec, adapters_disabled, add_adapters, count_parameters,
                                 is_adapter_name, merge_adapters)
from asyncrl.models.peft_io import load_peft_adapter, save_peft_adapter

from .helpers import right_padded_batch

LENGTHS = [11, 7, 3]


def randomize_adapters(model: torch.nn.Module, seed: int, std: float = 0.1) -> None:
    """B is zero after init (no effect); a random B makes every adapter change the outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if is_adapter_name(name):
                parameter.copy_(torch.randn(tuple(parameter.shape), generator=generator) * std)


def logits_of(model, input_ids, positions):
    with torch.no_grad():
        return model.compute_logits(model(input_ids, positions))


@pytest.fixture()
def batch(family_folders):
    config = load_model(family_folders["qwen2_bias_tied"]).config
    return right_padded_batch(LENGTHS, config.vocab_size, seed=3)


def test_peft_names_and_only_adapters_trainable(family_folders):
    model = load_model(family_folders["qwen2_bias_tied"])
    num_base = sum(parameter.numel() for parameter in model.parameters())
    adapted = add_adapters(model, LoRASpec(rank=4, alpha=8.0))
    config = model.config
    assert len(adapted) == 7 * config.num_hidden_layers
    names = {name for name, _ in model.named_parameters()}
    assert "model.layers.0.self_attn.q_proj.weight" in names  # the base keeps its HF name
    assert "model.layers.0.self_attn.q_proj.bias" in names
    assert "model.layers.1.mlp.down_proj.lora_A.weight" in names
    assert "model.layers.1.mlp.down_proj.lora_B.weight" in names
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable == {name for name in names if is_adapter_name(name)}
    # Per layer and projection r x (in + out): hand count for hidden 64, intermediate 128, q 64, kv 32 wide.
    hidden, inter = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * config.head_dim
    per_layer = 4 * ((hidden + hidden) * 2 + (hidden + kv) * 2 + (hidden + inter) * 2 + (inter + hidden))
    assert count_parameters(model) == (per_layer * config.num_hidden_layers,
                                       num_base + per_layer * config.num_hidden_layers)


def test_gradients_reach_only_adapters(family_folders, batch):
    model = load_model(family_folders["qwen2_bias_tied"])
    add_adapters(model, LoRASpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj")))
    randomize_adapters(model, seed=1)
    input_ids, positions, _ = batch
    model.compute_logits(model(input_ids, positions)).logsumexp(-1).mean().backward()
    for name, parameter in model.named_parameters():
        if is_adapter_name(name):
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
        else:
            assert parameter.grad is None, name
    adapted = {name.split(".")[-3] for name, _ in model.named_parameters() if is_adapter_name(name)}
    assert adapted == {"q_proj", "v_proj", "down_proj"}


def test_fresh_adapters_and_disabled_adapters_are_the_base_model(family_folders, batch):
    base = load_model(family_folders["qwen2_bias_tied"])
    model = load_model(family_folders["qwen2_bias_tied"])
    add_adapters(model, LoRASpec(rank=4, alpha=8.0))
    input_ids, positions, _ = batch
    expected = logits_of(base, input_ids, positions)
    assert torch.equal(logits_of(model, input_ids, positions), expected)  # B = 0: exactly no change
    randomize_adapters(model, seed=2)
    adapted = logits_of(model, input_ids, positions)
    assert (adapted - expected).abs().max() > 1e-2
    with adapters_disabled(model):
        assert torch.equal(logits_of(model, input_ids, positions), expected)
    assert torch.equal(logits_of(model, input_ids, positions), adapted)  # enabled again on leaving


def test_same_seed_same_adapters_and_init_choices():
    def build(spec):
        layer = torch.nn.Sequential()
        layer.q_proj = torch.nn.Linear(16, 8, bias=False)
        add_adapters(layer, spec)
        return layer.q_proj
    first, second = build(LoRASpec(rank=4, alpha=4.0, seed=5)), build(LoRASpec(rank=4, alpha=4.0, seed=5))
    assert torch.equal(first.lora_A.weight, second.lora_A.weight)
    assert torch.equal(first.lora_B.weight, torch.zeros(8, 4))
    gaussian = build(LoRASpec(rank=4, alpha=4.0, seed=5, init="gaussian")).lora_A.weight
    kaiming = build(LoRASpec(rank=4, alpha=4.0, seed=5, init="kaiming")).lora_A.weight
    assert kaiming.abs().max() <= 1 / 16 ** 0.5
    assert not torch.equal(gaussian, kaiming)


def test_engine_fused_projections_equal_the_trainer_layout(family_folders):
    """The engine stacks q/k/v and gate/up (`fuse_projections`); with adapters its numbers stay the trainer's."""
    trainer = load_model(family_folders["qwen3_qk_norm"])
    engine = load_model(family_folders["qwen3_qk_norm"])
    for model in (trainer, engine):
        add_adapters(model, LoRASpec(rank=4, alpha=8.0, target_modules=("k_proj", "up_proj", "o_proj")))
        randomize_adapters(model, seed=4)
    fuse_projections(engine.model)
    input_ids, positions, _ = right_padded_batch(LENGTHS, trainer.config.vocab_size, seed=3)
    assert torch.equal(logits_of(engine, input_ids, positions), logits_of(trainer, input_ids, positions))


def test_merged_weights_give_the_adapted_logits(family_folders, batch):
    model = load_model(family_folders["qwen2_bias_tied"])
    spec = LoRASpec(rank=4, alpha=16.0)
    add_adapters(model, spec)
    randomize_adapters(model, seed=5)
    merged_model = load_model(family_folders["qwen2_bias_tied"])
    state = {name: tensor.detach() for name, tensor in model.named_parameters()}
    merged_model.load_state_dict(merge_adapters(state, spec), strict=False)
    assert not any(isinstance(module, LoRALinear) for module in merged_model.modules())
    input_ids, positions, _ = batch
    merged, adapted = logits_of(merged_model, input_ids, positions), logits_of(model, input_ids, positions)
    # Equal up to fp32 rounding (W + s B A rounds once more than the unmerged sum): not bitwise, which is
    # why the engine keeps its adapters unmerged.
    assert (merged - adapted).abs().max() <= 1e-4
    assert (merged - logits_of(load_model(family_folders["qwen2_bias_tied"]), input_ids, positions)).abs().max() > 1e-2


def test_bad_specs_name_the_key():
    with pytest.raises(ValueError, match="model.target_modules"):
        LoRASpec(rank=4, alpha=8.0, target_modules=("qkv_proj",))
    with pytest.raises(ValueError, match="model.lora_rank"):
        LoRASpec(rank=0, alpha=8.0)
    with pytest.raises(ValueError, match="model.lora_init"):
        LoRASpec(rank=2, alpha=8.0, init="zeros")
    assert LoRASpec(rank=2, alpha=8.0).targets == PROJECTIONS


@pytest.mark.parametrize("case", ["qwen2_bias_tied", "llama_output_bias"])
def test_peft_loads_our_adapter_and_gives_our_logits(family_folders, tmp_path, case):
    peft = pytest.importorskip("peft", reason="peft is in the dev extra: pip install -e .[dev]")
    folder = family_folders[case]
    model = load_model(folder)
    spec = LoRASpec(rank=4, alpha=12.0, target_modules=("q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"))
    add_adapters(model, spec)
    randomize_adapters(model, seed=6)
    save_peft_adapter(tmp_path / "adapter", dict(model.named_parameters()), spec, str(folder))
    base = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    reference = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    input_ids, positions, attention_mask = right_padded_batch(LENGTHS, model.config.vocab_size, seed=3)
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    ours = logits_of(model, input_ids, positions)
    valid = attention_mask.bool()
    assert (ours[valid] - expected[valid]).abs().max() <= 1e-5
    with torch.no_grad(), reference.disable_adapter():
        base_logits = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    assert (base_logits[valid] - expected[valid]).abs().max() > 1e-2  # the adapter matters to PEFT too
    loaded_spec, tensors = load_peft_adapter(tmp_path / "adapter")
    assert loaded_spec.targets == spec.targets and loaded_spec.scale == spec.scale
    assert all(torch.equal(tensors[name], parameter) for name, parameter in model.named_parameters()
               if is_adapter_name(name))


def test_lora_on_a_mixture_of_experts_model_adapts_attention_and_refuses_expert_projections(tmp_path):
    model = load_model(build_tiny_model(tmp_path / "moe", family="qwen3_moe", num_layers=2))
    adapted = add_adapters(model, LoRASpec(rank=4, alpha=8.0, target_modules=("all-linear",)))
    assert sorted(adapted) == sorted(f"model.layers.{layer}.self_attn.{name}" for layer in range(2)
                                     for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable and all("lora_" in name and "experts" not in name for name in trainable)
    fresh = load_model(tmp_path / "moe")
    with pytest.raises(ValueError, match=r"adapts model.layers.0.mlp.experts.0.gate_proj, an expert of a mixture"):
        add_adapters(fresh, LoRASpec(rank=4, alpha=8.0, target_modules=("q_proj", "gate_proj")))
