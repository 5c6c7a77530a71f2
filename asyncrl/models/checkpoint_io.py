"""HF-format model folders: config.json + safetensors (single file or sharded with an index) + tokenizer files.

    model = load_model("Qwen2.5-0.5B-Instruct", dtype=torch.bfloat16, device="cuda")
    critic = load_model("Qwen2.5-0.5B-Instruct", kind="value")    # backbone from the LM, fresh score head
    scorer = load_model("my-reward-model", kind="reward")          # a *ForSequenceClassification folder
    check_model_folder("Qwen2.5-0.5B-Instruct")                   # load_model's errors, from file headers only
    save_model(model, "out/step_10", tokenizer_folder="Qwen2.5-0.5B-Instruct")
    for name, tensor in iter_named_tensors(model): ...             # weight sync, HF names
    load_named_tensors(engine_model, pairs)                        # in-place copy, no reallocation

Our parameter names equal HF's, so loading is a name match; anything missing, unexpected or of the wrong shape
raises before a single weight is copied. Models are built on the meta device and then materialised once, so
loading a 7B model does not first run a random init. A damaged weight file (truncated, a bad header) or shard
index raises ValueError naming the file and, where the header tells, the tensor.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from asyncrl.models.model_config import MODEL_KINDS, TransformerConfig, architecture_of
from asyncrl.models.sequence_classification import RewardModel
from asyncrl.models.transformer import CausalLM, ValueModel

CONFIG_FILE = "config.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
SHARD_PATTERN = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
# Copied byte for byte from a source folder on save; whichever of them exist.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "generation_config.json",
    "chat_template.jinja", "chat_template.json",
)
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3
SAFETENSORS_DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
    "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}

Model = CausalLM | ValueModel | RewardModel


def read_config(folder: str | Path) -> tuple[TransformerConfig, str]:
    """(config, kind stored in the folder: "causal_lm", "value" or "reward") from folder/config.json."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"model folder {folder} does not exist")
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise ValueError(f"model folder {folder} has no {CONFIG_FILE}")
    try:
        hf_config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path} is not valid JSON: {error}") from None
    _, stored_kind = architecture_of(hf_config, str(config_path))
    if stored_kind == "reward":
        _check_one_label(hf_config, config_path)
    return TransformerConfig.from_hf_dict(hf_config, str(config_path)), stored_kind


def load_model(folder: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
               kind: str = "causal_lm") -> Model:
    """Builds a CausalLM (kind "causal_lm"), ValueModel (kind "value") or RewardModel (kind "reward") from an
    HF folder.

    A value model loads from its own saved folder (score head included) or from a causal-LM folder (backbone
    loaded, lm_head ignored, score head initialised by `ValueModel.reset_score_head`). A reward model loads
    only from a sequence-classification folder: its head is what it has learned.
    """
    folder = Path(folder)
    model, stored_kind = _empty_model(folder, kind)
    model.to(dtype=dtype)
    model.to_empty(device=device)
    # to_empty unties shared parameters (RoPE frequencies are recomputed by RotaryEmbedding itself).
    if isinstance(model, CausalLM):
        model.tie_weights()
    ignored, optional = _skipped_names(model, kind, stored_kind)
    _load_weights(model, folder, ignored, optional)
    if isinstance(model, ValueModel) and optional:  # a new score head: the files hold none
        model.reset_score_head()
    return model


def check_model_folder(folder: str | Path, kind: str = "causal_lm") -> TransformerConfig:
    """Raises the ValueError `load_model` would raise for this folder (config.json, architecture, weight files,
    tensor names and shapes) without reading a tensor: the model is built on the meta device and compared
    with the safetensors headers, so the check needs neither the weights' memory nor the time to read them."""
    folder = Path(folder)
    model, stored_kind = _empty_model(folder, kind)
    _match_weights(model, folder, *_skipped_names(model, kind, stored_kind))
    return model.config


def _empty_model(folder: Path, kind: str) -> tuple[Model, str]:
    """The model of folder/config.json on the meta device, and the kind stored in the folder."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"kind must be one of {MODEL_KINDS}, got {kind!r}")
    config, stored_kind = read_config(folder)
    if kind == "causal_lm" and stored_kind == "value":
        raise ValueError(f"model folder {folder} holds a value model (token classification); cannot load it as a causal LM")
    if (kind == "reward") != (stored_kind == "reward"):
        raise ValueError(f"model folder {folder} holds a {STORED_KIND_NAMES[stored_kind]}; cannot load it as a "
                         f"{STORED_KIND_NAMES[kind]}")
    with torch.device("meta"):
        model = {"causal_lm": CausalLM, "value": ValueModel, "reward": RewardModel}[kind](config)
    return model, stored_kind


STORED_KIND_NAMES = {"causal_lm": "causal LM (*ForCausalLM)", "value": "value model (*ForTokenClassification)",
                     "reward": "reward model (*ForSequenceClassification)"}


def _check_one_label(hf_config: dict, config_path: Path) -> None:
    """A reward model gives one number: num_labels 1 (`transformers` reads num_labels from id2label, and
    takes 2 when config.json has neither)."""
    labels = hf_config.get("id2label")
    num_labels = len(labels) if isinstance(labels, dict) else hf_config.get("num_labels", 2)
    if num_labels != 1:
        raise ValueError(f"{config_path}: a reward model has one output (num_labels=1, one id2label entry), got "
                         f"num_labels={num_labels}; a classifier with several labels gives no scalar reward")


def _skipped_names(model: Model, kind: str, stored_kind: str) -> tuple[set[str], set[str]]:
    """(names ignored when the files hold them, parameters the files may lack: a new value head)."""
    ignored = {"lm_head.weight"} if kind != "causal_lm" or model.config.tie_word_embeddings else set()
    is_new_head = kind == "value" and stored_kind == "causal_lm"
    return ignored, {"score.weight", "score.bias"} if is_new_head else set()


def _weight_files(folder: Path) -> list[Path]:
    index_path = folder / WEIGHTS_INDEX_FILE
    if index_path.is_file():
        weight_map = _read_weight_map(index_path)
        files = [folder / name for name in sorted(set(weight_map.values()))]
        for path in files:
            if not path.is_file():
                raise ValueError(f"model folder {folder}: {WEIGHTS_INDEX_FILE} names {path.name}, which is missing")
        return files
    if (folder / SINGLE_WEIGHTS_FILE).is_file():
        return [folder / SINGLE_WEIGHTS_FILE]
    raise ValueError(
        f"model folder {folder} has neither {SINGLE_WEIGHTS_FILE} nor {WEIGHTS_INDEX_FILE} "
        "(only safetensors checkpoints are supported)")


def _read_weight_map(index_path: Path) -> dict[str, str]:
    try:
        index = json.loads(index_path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{index_path} is not valid JSON ({error}); download it again") from None
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):  # a file, not our config
        raise ValueError(f"{index_path} has no weight_map object (tensor name -> shard file); download it again")
    return index["weight_map"]


def _read_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from a safetensors header; a damaged file raises ValueError naming it (and the tensor
    the damage is in, where the header says)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except SafetensorError as error:
        raise ValueError(f"{path} is not a readable safetensors file: {_describe_damage(path) or error}; download "
                         "or save it again") from None


def _describe_damage(path: Path) -> str | None:
    """What is wrong with a safetensors file that safetensors refused, read from its layout: 8 bytes of header
    length, a JSON header {name: {dtype, shape, data_offsets}}, then the tensors' bytes back to back. None when
    the layout looks right (safetensors' own message is used then)."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        header_length = int.from_bytes(file.read(8), "little")
        if size < 8:
            return f"the file has {size} bytes, fewer than the 8 that hold a header's length (empty or truncated)"
        if 8 + header_length > size:
            return (f"the file has {size} bytes, too few for the header its first 8 bytes announce "
                    f"({header_length} bytes): truncated, or not a safetensors file")
        try:
            header = json.loads(file.read(header_length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            return f"its header is not valid JSON ({error})"
    if not isinstance(header, dict):
        return f"its header is a JSON {type(header).__name__}, not an object"
    entries = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = entry["data_offsets"]
            entries.append((name, entry["dtype"], list(entry["shape"]), int(begin), int(end)))
        except (KeyError, TypeError, ValueError) as error:
            return f"the header entry of tensor {name} is malformed ({type(error).__name__}: {error})"
    data_size, end = size - 8 - header_length, 0
    for name, dtype, shape, begin, end in sorted(entries, key=lambda item: item[4]):
        if end > data_size:
            return (f"tensor {name} ends at byte {8 + header_length + end} but the file has only {size} bytes "
                    "(truncated: an interrupted download or save)")
        if dtype not in SAFETENSORS_DTYPE_BITS:
            return f"tensor {name} has dtype {dtype!r}, which safetensors does not know"
        expected = -(-math.prod(shape) * SAFETENSORS_DTYPE_BITS[dtype] // 8)
        if end - begin != expected:
            return (f"tensor {name} ({dtype}, shape {shape}) needs {expected} bytes but its header gives it "
                    f"{end - begin} (data_offsets {[begin, end]})")
    if end < data_size:
        return f"{data_size - end} bytes follow the last tensor's data (a file appended to, or overwritten)"
    return None


def _match_weights(model: Model, folder: Path, ignored: set[str], optional: set[str]) -> dict[str, Path]:
    """{parameter name: file holding it}, after checking every name and shape across all files. Names in
    `ignored` are skipped when present in the files; parameters in `optional` may be absent from them."""
    parameters = dict(model.named_parameters())  # a tied lm_head appears only as the embedding
    file_shapes: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for path in _weight_files(folder):
        file_shapes.update({name: (path, shape) for name, shape in _read_shapes(path).items()})
    # Old checkpoints store the RoPE buffer; it is recomputed from the config.
    names = {name for name in file_shapes if name not in ignored and not name.endswith("rotary_emb.inv_freq")}
    missing = sorted(set(parameters) - names - optional)
    unexpected = sorted(names - set(parameters))
    if missing or unexpected:
        raise ValueError(
            f"model folder {folder} does not match {type(model).__name__}: missing tensors {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''}, unexpected tensors {unexpected[:8]}"
            f"{' ...' if len(unexpected) > 8 else ''}")
    for name in sorted(names):
        path, shape = file_shapes[name]
        if shape != tuple(parameters[name].shape):
            raise ValueError(
                f"model folder {folder}: tensor {name} in {path.name} has shape {list(shape)}, "
                f"the model expects {list(parameters[name].shape)}")
    return {name: file_shapes[name][0] for name in names}


def _load_weights(model: Model, folder: Path, ignored: set[str], optional: set[str]) -> None:
    """Checks every name and shape first (`_match_weights`), then copies, each tensor checked finite (a NaN
    weight would otherwise surface steps later as an unnamed non-finite loss)."""
    parameters = dict(model.named_parameters())
    files = _match_weights(model, folder, ignored, optional)
    with torch.no_grad():
        for path in sorted(set(files.values())):
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    if name in files:
                        tensor = handle.get_tensor(name)
                        check_finite(tensor, f"model folder {folder}: tensor {name} in {path.name}")
                        parameters[name].copy_(tensor)


def check_finite(tensor: Tensor, where: str) -> None:
    if tensor.is_floating_point():
        bad = int((~torch.isfinite(tensor)).sum())
        if bad:
            raise ValueError(f"{where} holds {bad} non-finite value(s) (NaN or inf) of {tensor.numel()}: the weights "
                             f"are damaged (a diverged run's save?); use other weights")


def save_model(model: Model, folder: str | Path, tokenizer_folder: str | Path | None = None,
               max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> Path:
    """Writes config.json and the weights (one model.safetensors, or model-0000i-of-0000n.safetensors plus
    model.safetensors.index.json when larger than `max_shard_bytes`) in the parameters' dtype, then copies
    tokenizer files from `tokenizer_folder` byte for byte. Returns the folder.

    Stale weight files of an earlier save into the same folder are removed first. Not atomic: callers that
    need that save into a temporary folder and rename it.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.name in (SINGLE_WEIGHTS_FILE, WEIGHTS_INDEX_FILE) or SHARD_PATTERN.fullmatch(path.name):
            path.unlink()
    tensors = {name: tensor.to("cpu").contiguous() for name, tensor in iter_named_tensors(model)}
    shards = _split_into_shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], str(folder / SINGLE_WEIGHTS_FILE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for index, shard in enumerate(shards):
            file_name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(folder / file_name), metadata={"format": "pt"})
            weight_map.update({name: file_name for name in shard})
        total_size = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
        index_json = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / WEIGHTS_INDEX_FILE).write_text(json.dumps(index_json, indent=2) + "\n")
    kind = "value" if isinstance(model, ValueModel) else "reward" if isinstance(model, RewardModel) else "causal_lm"
    dtype = next(model.parameters()).dtype
    hf_config = model.config.to_hf_dict(kind=kind, dtype=dtype)
    (folder / CONFIG_FILE).write_text(json.dumps(hf_config, indent=2) + "\n")
    if tokenizer_folder is not None:
        copy_tokenizer_files(tokenizer_folder, folder)
    return folder


def _split_into_shards(tensors: dict[str, Tensor], max_shard_bytes: int) -> list[dict[str, Tensor]]:
    """Greedy split in name order; a single tensor larger than the limit gets a shard of its own."""
    shards: list[dict[str, Tensor]] = [{}]
    shard_bytes = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and shard_bytes + size > max_shard_bytes:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += size
    return shards


def copy_tokenizer_files(source: str | Path, destination: str | Path) -> list[str]:
    """Byte-copies the tokenizer / generation-config files present in `source`; returns their names."""
    source, destination = Path(source), Path(destination)
    if not source.is_dir():
        raise ValueError(f"tokenizer folder {source} does not exist")
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file() and source.resolve() != destination.resolve():
            shutil.copyfile(source / name, destination / name)
            copied.append(name)
    return copied


def iter_named_tensors(model: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """(HF name, detached tensor) for every parameter; a tied lm_head is yielded once, as the embedding."""
    for name, parameter in model.named_parameters():
        yield name, parameter.detach()


def load_named_tensors(model: nn.Module, pairs: Iterable[tuple[str, Tensor]]) -> int:
    """Copies tensors into the model's parameters in place (storage, dtype and device kept); returns how many.

    Any subset of names may be given (weight sync sends buckets). An unknown name or a shape mismatch raises
    ValueError. `lm_head.weight` of a tied model is skipped: it is the embedding, which is sent on its own.
    """
    parameters = dict(model.named_parameters())
    is_tied = isinstance(model, CausalLM) and model.config.tie_word_embeddings
    num_copied = 0
    with torch.no_grad():
        for name, tensor in pairs:
            if name == "lm_head.weight" and is_tied:
                continue
            if name not in parameters:
                raise ValueError(f"load_named_tensors: unknown tensor {name} for {type(model).__name__}")
            target = parameters[name]
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"load_named_tensors: tensor {name} has shape {list(tensor.shape)}, "
                    f"the model expects {list(target.shape)}")
            target.copy_(tensor)
            num_copied += 1
    return num_copied
