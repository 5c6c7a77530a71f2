"""HF folder I/O: bitwise round trips (single and sharded), transformers interop, in-place updates, errors."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from asyncrl.models import (
    ValueModel,
    build_tiny_model,
    check_model_folder,
    iter_named_tensors,
    load_model,
    load_named_tensors,
    save_model,
)
from asyncrl.models.checkpoint_io import TOKENIZER_FILES

from .helpers import right_padded_batch


def _assert_bitwise_equal(model_a, model_b) -> None:
    tensors_a, tensors_b = dict(iter_named_tensors(model_a)), dict(iter_named_tensors(model_b))
    assert tensors_a.keys() == tensors_b.keys()
    for name in tensors_a:
        assert tensors_a[name].dtype == tensors_b[name].dtype, name
        assert torch.equal(tensors_a[name], tensors_b[name]), name


@pytest.mark.parametrize("case", ["llama3_scaled_untied", "qwen2_bias_tied"])
def test_single_file_round_trip_is_bitwise(family_folders, tmp_path, case):
    source = family_folders[case]
    model = load_model(source)
    save_model(model, tmp_path / "copy", tokenizer_folder=source)
    assert (tmp_path / "copy" / "model.safetensors").is_file()
    assert not (tmp_path / "copy" / "model.safetensors.index.json").exists()
    _assert_bitwise_equal(model, load_model(tmp_path / "copy"))
    stored = load_file(str(tmp_path / "copy" / "model.safetensors"))
    assert ("lm_head.weight" in stored) == (not model.config.tie_word_embeddings)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            assert (tmp_path / "copy" / name).read_bytes() == (source / name).read_bytes(), name
    assert (tmp_path / "copy" / "tokenizer.json").is_file()


def test_sharded_round_trip_is_bitwise_and_loads_in_transformers(family_folders, tmp_path):
    model = load_model(family_folders["llama3_scaled_untied"])
    save_model(model, tmp_path / "sharded", max_shard_bytes=40_000)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    shard_names = sorted(set(index["weight_map"].values()))
    assert len(shard_names) > 2 and shard_names[0] == f"model-00001-of-{len(shard_names):05d}.safetensors"
    assert set(index["weight_map"]) == {name for name, _ in iter_named_tensors(model)}
    total_size = sum(tensor.numel() * 4 for _, tensor in iter_named_tensors(model))
    assert index["metadata"]["total_size"] == total_size
    assert not (tmp_path / "sharded" / "model.safetensors").exists()
    _assert_bitwise_equal(model, load_model(tmp_path / "sharded"))
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sharded", dtype=torch.float32)
    input_ids, positions, attention_mask = right_padded_batch([6, 3], model.config.vocab_size)
    with torch.no_grad():
        ours = model.compute_logits(model(input_ids, positions))
        theirs = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    assert (ours - theirs)[attention_mask.bool()].abs().max().item() <= 1e-5


def test_resaving_into_a_folder_removes_stale_shards(family_folders, tmp_path):
    model = load_model(family_folders["qwen2_bias_tied"])
    save_model(model, tmp_path / "out", max_shard_bytes=40_000)
    save_model(model, tmp_path / "out")
    weight_files = sorted(path.name for path in (tmp_path / "out").glob("model*"))
    assert weight_files == ["model.safetensors"]


def test_bf16_save_keeps_dtype(family_folders, tmp_path):
    model = load_model(family_folders["qwen3_qk_norm"], dtype=torch.bfloat16)
    assert {tensor.dtype for _, tensor in iter_named_tensors(model)} == {torch.bfloat16}
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # RoPE frequencies stay fp32
    save_model(model, tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    _assert_bitwise_equal(model, load_model(tmp_path / "bf16", dtype=torch.bfloat16))


def test_value_model_round_trip_and_start_from_causal_lm(family_folders, tmp_path):
    source = family_folders["qwen2_bias_tied"]
    policy = load_model(source)
    critic = load_model(source, kind="value")
    assert isinstance(critic, ValueModel)
    backbone = {name: tensor for name, tensor in iter_named_tensors(policy) if name.startswith("model.")}
    for name, tensor in iter_named_tensors(critic):
        if name.startswith("model."):
            assert torch.equal(tensor, backbone[name]), name
    assert torch.equal(critic.score.weight, load_model(source, kind="value").score.weight)  # deterministic head
    with torch.no_grad():
        critic.score.weight.mul_(3.0)
        critic.score.bias.fill_(-0.5)
    save_model(critic, tmp_path / "critic")
    assert json.loads((tmp_path / "critic" / "config.json").read_text())["architectures"] == ["Qwen2ForTokenClassification"]
    _assert_bitwise_equal(critic, load_model(tmp_path / "critic", kind="value"))
    with pytest.raises(ValueError, match="holds a value model"):
        load_model(tmp_path / "critic")


def test_load_named_tensors_copies_in_place(family_folders):
    trainer_model = load_model(family_folders["qwen2_bias_tied"])
    engine_model = load_model(family_folders["qwen2_bias_tied"], dtype=torch.bfloat16)
    with torch.no_grad():
        for parameter in trainer_model.parameters():
            parameter.add_(0.5)
    pointers_before = {name: tensor.data_ptr() for name, tensor in iter_named_tensors(engine_model)}
    num_copied = load_named_tensors(engine_model, iter_named_tensors(trainer_model))
    assert num_copied == len(pointers_before)
    for name, tensor in iter_named_tensors(engine_model):
        assert tensor.data_ptr() == pointers_before[name], name
        assert tensor.dtype == torch.bfloat16
    trainer_tensors = dict(iter_named_tensors(trainer_model))
    for name, tensor in iter_named_tensors(engine_model):
        assert torch.equal(tensor, trainer_tensors[name].to(torch.bfloat16)), name
    assert engine_model.lm_head.weight is engine_model.model.embed_tokens.weight  # still tied


def test_load_named_tensors_rejects_unknown_names_and_shapes(qwen2_model):
    with pytest.raises(ValueError, match="unknown tensor model.layers.9.mlp.up_proj.weight"):
        load_named_tensors(qwen2_model, [("model.layers.9.mlp.up_proj.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match=r"tensor model.norm.weight has shape \[3\], the model expects \[64\]"):
        load_named_tensors(qwen2_model, [("model.norm.weight", torch.zeros(3))])


def _assert_both_raise(folder, message) -> None:
    """load_model and check_model_folder (headers only, used before a run starts) raise the same error."""
    for function in (load_model, check_model_folder):
        with pytest.raises(ValueError, match=message):
            function(folder)


def test_missing_folder_config_and_weights_are_named(family_folders, tmp_path):
    _assert_both_raise(tmp_path / "absent", f"model folder {tmp_path / 'absent'} does not exist")
    (tmp_path / "empty").mkdir()
    _assert_both_raise(tmp_path / "empty", f"model folder {tmp_path / 'empty'} has no config.json")
    (tmp_path / "empty" / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"],')
    _assert_both_raise(tmp_path / "empty", f"{tmp_path / 'empty' / 'config.json'} is not valid JSON")
    shutil.copy(family_folders["qwen2_bias_tied"] / "config.json", tmp_path / "empty" / "config.json")
    _assert_both_raise(tmp_path / "empty", "has neither model.safetensors nor model.safetensors.index.json")
    for kind in ("causal_lm", "value"):
        assert check_model_folder(family_folders["qwen2_bias_tied"], kind) == load_model(
            family_folders["qwen2_bias_tied"]).config


def _copy_with_edited_weights(source, destination, edit) -> None:
    shutil.copytree(source, destination)
    tensors = load_file(str(destination / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(destination / "model.safetensors"), metadata={"format": "pt"})


def test_missing_unexpected_and_misshaped_tensors_are_named(family_folders, tmp_path):
    source = family_folders["llama3_scaled_untied"]
    _copy_with_edited_weights(source, tmp_path / "missing", lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    _assert_both_raise(tmp_path / "missing", r"missing tensors \['model.layers.1.mlp.down_proj.weight'\]")
    _copy_with_edited_weights(source, tmp_path / "extra", lambda t: t.update({"model.extra.weight": torch.zeros(2)}))
    _assert_both_raise(tmp_path / "extra", r"unexpected tensors \['model.extra.weight'\]")

    def shrink(tensors):
        tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)

    _copy_with_edited_weights(source, tmp_path / "shape", shrink)
    _assert_both_raise(tmp_path / "shape", (
        rf"model folder {tmp_path / 'shape'}: tensor model.layers.0.self_attn.k_proj.weight in model.safetensors "
        r"has shape \[16, 64\], the model expects \[32, 64\]"))


def test_unsupported_architecture_names_the_file(family_folders, tmp_path):
    shutil.copytree(family_folders["qwen2_bias_tied"], tmp_path / "moe")
    config_path = tmp_path / "moe" / "config.json"
    hf_config = json.loads(config_path.read_text())
    hf_config.update(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe")
    config_path.write_text(json.dumps(hf_config))
    _assert_both_raise(tmp_path / "moe", rf"{config_path}: architectures=\['Qwen2MoeForCausalLM'\] is not supported")


def _rewrite_header(path, edit) -> None:
    """Rewrites a safetensors file's JSON header through `edit(header)`, keeping its tensor bytes."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    edit(header)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + length:])


def test_a_damaged_safetensors_file_is_named_with_the_tensor_the_damage_is_in(family_folders, tmp_path):
    source = family_folders["qwen2_bias_tied"]
    weights = "model.safetensors"
    cases = {}
    shutil.copytree(source, tmp_path / "truncated")
    header_length = int.from_bytes((source / weights).read_bytes()[:8], "little")
    header = json.loads((source / weights).read_bytes()[8:8 + header_length])
    last_name, last = max(((name, entry) for name, entry in header.items() if name != "__metadata__"),
                          key=lambda item: item[1]["data_offsets"][1])
    size = (source / weights).stat().st_size
    with open(tmp_path / "truncated" / weights, "r+b") as file:  # an interrupted download: the last 100 bytes
        file.truncate(size - 100)
    cases["truncated"] = (rf"tensor {re.escape(last_name)} ends at byte {size} but the file has only {size - 100} "
                          r"bytes \(truncated: an interrupted download or save\)")
    shutil.copytree(source, tmp_path / "cut_in_header")
    with open(tmp_path / "cut_in_header" / weights, "r+b") as file:
        file.truncate(50)
    cases["cut_in_header"] = (rf"the file has 50 bytes, too few for the header its first 8 bytes announce "
                              rf"\({header_length} bytes\): truncated, or not a safetensors file")
    shutil.copytree(source, tmp_path / "empty")
    (tmp_path / "empty" / weights).write_bytes(b"")
    cases["empty"] = r"the file has 0 bytes, fewer than the 8 that hold a header's length \(empty or truncated\)"
    shutil.copytree(source, tmp_path / "bad_dtype")
    _rewrite_header(tmp_path / "bad_dtype" / weights, lambda header: header[last_name].update(dtype="Q9"))
    cases["bad_dtype"] = rf"tensor {re.escape(last_name)} has dtype 'Q9', which safetensors does not know"
    shutil.copytree(source, tmp_path / "bad_shape")
    _rewrite_header(tmp_path / "bad_shape" / weights, lambda header: header[last_name].update(shape=[3]))
    begin, end = last["data_offsets"]
    cases["bad_shape"] = (rf"tensor {re.escape(last_name)} \(F32, shape \[3\]\) needs 12 bytes but its header gives "
                          rf"it {end - begin} \(data_offsets \[{begin}, {end}\]\)")
    for case, detail in cases.items():
        _assert_both_raise(tmp_path / case, rf"{re.escape(str(tmp_path / case / weights))} is not a readable "
                                            rf"safetensors file: {detail}; download or save it again")


def test_a_damaged_shard_index_is_named(family_folders, tmp_path):
    model = load_model(family_folders["qwen2_bias_tied"])
    save_model(model, tmp_path / "sharded", max_shard_bytes=40_000)
    index_path = tmp_path / "sharded" / "model.safetensors.index.json"
    index_path.write_text('{"weight_map": {')
    _assert_both_raise(tmp_path / "sharded", rf"{re.escape(str(index_path))} is not valid JSON \(Expecting "
                                             r"property name .* line 1 column 17")
    index_path.write_text('{"metadata": {}}')
    _assert_both_raise(tmp_path / "sharded", rf"{re.escape(str(index_path))} has no weight_map object")


def test_a_nan_weight_is_named_at_load(tmp_path):
    folder = build_tiny_model(tmp_path / "tiny", family="qwen2", seed=0)
    weights = next(folder.glob("*.safetensors"))
    tensors = load_file(weights)
    name = sorted(tensors)[-1]
    tensors[name].view(-1)[:3] = float("nan")
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"model folder {re.escape(str(folder))}: tensor {re.escape(name)} in "
                                         rf"{weights.name} holds 3 non-finite value\(s\) \(NaN or inf\)"):
        load_model(folder)
