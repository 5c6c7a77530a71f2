"""The fully-async recipe's checkpointed state as data only: JSON for the structure, safetensors for the arrays.
No pickle, so a checkpoint folder someone else wrote cannot run code when a run resumes from it.

    artifacts = encode_state(state)   # {"fully_async_state.json": ..., "fully_async_state.safetensors": ...}
    state = load_state(folder)        # the same records back; None when the folder holds no fully-async state

The state holds the data cursor, the parked groups (with their partial `GenerationResult`s) and the queued
scored `Sample`s. Records are dataclasses named in `RECORD_TYPES`; their fields are written by name, so a
field added later with a default reads older files. A new record type (e.g. an agent trajectory with its
messages and segments) is one `register_record(Trajectory, since_version=...)` line below its imports, provided
its fields hold numbers, strings, numpy arrays, lists, dicts or other registered records.

JSON forms (every non-scalar is a one-key object naming its kind, except lists):
    {"record": "Sample", "fields": {...}}   {"array": "<name in the safetensors file>"}
    {"map": {str: ...}}   {"pairs": [[key, value], ...]} (non-string keys)   {"tuple": [...]}
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as load_arrays
from safetensors.numpy import save as save_arrays

from asyncrl.core.records import Sample
from asyncrl.data.records import PromptRecord, TokenizedPrompt
from asyncrl.engine import GenerationResult
from asyncrl.recipes.fully_async.group import Group
from asyncrl.rollout.agent import ToolCallRecord, Trajectory
from asyncrl.teacher import TeacherScore

STATE_VERSION = 1
STRUCTURE_FILE = "fully_async_state.json"
ARRAYS_FILE = "fully_async_state.safetensors"
LEGACY_PICKLE_FILE = "fully_async_state.pkl"  # what earlier versions wrote; never read


class StateFileError(ValueError):
    """A fully-async state file that is not what this codec writes."""


@dataclass(frozen=True)
class RecordType:
    name: str            # how the JSON names it: stable across renames of the class
    cls: type
    since_version: int   # the first STATE_VERSION whose files may hold it


RECORD_TYPES: dict[str, RecordType] = {}


def register_record(cls: type, since_version: int = 1, name: Optional[str] = None) -> RecordType:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass; the state codec writes dataclass records by field")
    entry = RecordType(name or cls.__name__, cls, since_version)
    if entry.name in RECORD_TYPES and RECORD_TYPES[entry.name].cls is not cls:
        raise ValueError(f"record name {entry.name} is taken by {RECORD_TYPES[entry.name].cls.__qualname__}")
    RECORD_TYPES[entry.name] = entry
    return entry


register_record(PromptRecord)
register_record(TokenizedPrompt)
register_record(GenerationResult)
register_record(Sample)
register_record(Group)
register_record(Trajectory)        # rollout.multi_turn: a parked group's token logs, their messages and calls
register_record(ToolCallRecord)
register_record(TeacherScore)      # algorithm.distillation: a queued sample's teacher log-probs


# ---- writing ------------------------------------------------------------------------------------------------
def encode_state(state: dict[str, Any]) -> dict[str, bytes]:
    """The two checkpoint files of `state` (the artifacts `CheckpointManager.save` writes)."""
    arrays: dict[str, np.ndarray] = {}
    structure = {"version": STATE_VERSION, "state": encode(state, "state", arrays)}
    return {STRUCTURE_FILE: json.dumps(structure).encode(), ARRAYS_FILE: save_arrays(arrays)}


def encode(value: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value, order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"fully-async state: {path} is a numpy array of {array.dtype}; only numbers are stored")
        arrays[path] = array
        return {"array": path, **({"scalar": True} if isinstance(value, np.generic) else {})}
    if isinstance(value, list):
        return [encode(item, f"{path}.{index}", arrays) for index, item in enumerate(value)]
    if isinstance(value, tuple):
        return {"tuple": [encode(item, f"{path}.{index}", arrays) for index, item in enumerate(value)]}
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value):
            return {"map": {key: encode(item, f"{path}.{key}", arrays) for key, item in value.items()}}
        return {"pairs": [[encode(key, f"{path}.key{index}", arrays), encode(item, f"{path}.{key}", arrays)]
                          for index, (key, item) in enumerate(value.items())]}
    entry = record_type_of(value)
    if entry is None:
        raise TypeError(f"fully-async state: {path} is a {type(value).__qualname__}, which the state codec does not "
                        f"know; register it with register_record (asyncrl/recipes/fully_async/state_codec.py)")
    return {"record": entry.name, "fields": {field.name: encode(getattr(value, field.name), f"{path}.{field.name}",
                                                                 arrays)
                                             for field in dataclasses.fields(value)}}


def record_type_of(value: Any) -> Optional[RecordType]:
    return next((entry for entry in RECORD_TYPES.values() if type(value) is entry.cls), None)


# ---- reading ------------------------------------------------------------------------------------------------
def load_state(folder: Path) -> Optional[dict[str, Any]]:
    """The state saved in a checkpoint folder, or None when it holds none (a checkpoint written at the end)."""
    legacy = folder / LEGACY_PICKLE_FILE
    if legacy.exists():
        raise StateFileError(f"checkpoint file {legacy} is a pickle (written by asyncrl before checkpoints held "
                             f"only data, or planted); asyncrl never unpickles checkpoint files, since loading a "
                             f"pickle can run any code. Resume from a checkpoint this version wrote")
    if not (folder / STRUCTURE_FILE).is_file():
        return None
    return decode_state((folder / STRUCTURE_FILE).read_bytes(), (folder / ARRAYS_FILE).read_bytes(), folder)


def decode_state(structure_bytes: bytes, arrays_bytes: bytes, folder: Path) -> dict[str, Any]:
    structure_path, arrays_path = folder / STRUCTURE_FILE, folder / ARRAYS_FILE
    try:
        structure = json.loads(structure_bytes)
    except ValueError as error:
        raise StateFileError(f"fully-async state file {structure_path} is not valid JSON: {error}") from error
    if not isinstance(structure, dict) or not isinstance(structure.get("version"), int) or "state" not in structure:
        raise StateFileError(f"fully-async state file {structure_path} has no version and state")
    if structure["version"] > STATE_VERSION:
        raise StateFileError(f"fully-async state file {structure_path} is version {structure['version']}, newer than "
                             f"this asyncrl reads ({STATE_VERSION}); resume with the version that wrote it")
    try:
        arrays = load_arrays(arrays_bytes)
    except SafetensorError as error:
        raise StateFileError(f"fully-async state file {arrays_path} is not a readable safetensors file: {error}") \
            from error
    try:
        return Decoder(arrays, structure["version"], structure_path, arrays_path).decode(structure["state"], "state")
    except StateFileError:
        raise
    except (TypeError, ValueError) as error:  # a malformed form: a pair that is not two items, a list as a key
        raise StateFileError(f"fully-async state file {structure_path} is malformed: {error}") from error


class Decoder:
    def __init__(self, arrays: dict[str, np.ndarray], version: int, structure_path: Path, arrays_path: Path):
        self.arrays, self.version = arrays, version
        self.structure_path, self.arrays_path = structure_path, arrays_path

    def fail(self, path: str, problem: str) -> StateFileError:
        return StateFileError(f"fully-async state file {self.structure_path}: {path} {problem}")

    def decode(self, value: Any, path: str) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, list):
            return [self.decode(item, f"{path}.{index}") for index, item in enumerate(value)]
        if not isinstance(value, dict) or len(value) not in (1, 2):
            raise self.fail(path, f"is not a form the state codec writes: {str(value)[:80]}")
        if "array" in value:
            return self.array(value, path)
        if "tuple" in value:
            return tuple(self.decode(value["tuple"], path))
        if "map" in value and isinstance(value["map"], dict):
            return {key: self.decode(item, f"{path}.{key}") for key, item in value["map"].items()}
        if "pairs" in value and isinstance(value["pairs"], list):
            return {self.decode(key, f"{path}.key"): self.decode(item, f"{path}.{index}")
                    for index, (key, item) in enumerate(value["pairs"])}
        if "record" in value and isinstance(value.get("fields"), dict):
            return self.record(value["record"], value["fields"], path)
        raise self.fail(path, f"is not a form the state codec writes: {str(value)[:80]}")

    def array(self, value: dict[str, Any], path: str) -> Any:
        name = value["array"]
        if name not in self.arrays:
            raise StateFileError(f"fully-async state file {self.arrays_path} has no array {name!r}, which "
                                 f"{self.structure_path} refers to at {path}")
        array = self.arrays[name]
        return array[()] if value.get("scalar") else array

    def record(self, name: Any, fields: dict[str, Any], path: str) -> Any:
        entry = RECORD_TYPES.get(name) if isinstance(name, str) else None
        if entry is None:
            raise self.fail(path, f"is a record of unknown type {name!r}; known: {sorted(RECORD_TYPES)}")
        if entry.since_version > self.version:
            raise self.fail(path, f"is a {name}, which version {self.version} files cannot hold")
        known = {field.name for field in dataclasses.fields(entry.cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise self.fail(path, f"({name}) has fields {unknown} that {entry.cls.__qualname__} does not have")
        values = {field: self.decode(item, f"{path}.{field}") for field, item in fields.items()}
        try:
            return entry.cls(**values)
        except (TypeError, ValueError) as error:
            raise self.fail(path, f"is not a valid {name}: {error}") from error
