"""A user's code that a config value names: 'path/to/file.py:name' or 'package.module:name' (a reward function in
reward.custom_function, a tool's class_name in the tool YAML, your own agent in rollout.agent.path).

    spec = split_spec("my_reward.py:compute_score")     # UserSpec('my_reward.py', 'compute_score'); None if malformed
    value = load_attribute(spec, kind="reward")         # runs the file's top level, returns its `compute_score`

Loading runs the module's top level, which is user code that may raise, exit or hang: the caller decides in which
process that happens (reward functions: only in scoring processes, never in the driver). A spec that does not load
raises a `UserCodeError` saying what went wrong (`MissingFile`, `ImportFailed`, `MissingAttribute`); each caller
words its own message from it, naming its key or file. What the attribute must be (callable, an `async def`) is the
caller's to check.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Optional


@dataclass(frozen=True)
class UserSpec:
    location: str    # 'path/to/file.py' or 'package.module'
    name: str        # the attribute of the module

    @property
    def is_file(self) -> bool:
        return self.location.endswith(".py")


def split_spec(spec: str) -> Optional[UserSpec]:
    """The spec's location and name (split at its last colon), or None when either is missing."""
    location, separator, name = spec.rpartition(":")
    if not separator or not location or not name:
        return None
    return UserSpec(location, name)


class UserCodeError(Exception):
    """A spec that did not load; the subclass and its fields say why, for the caller's own message."""


class MissingFile(UserCodeError):
    def __init__(self, file: Path):
        super().__init__(f"file {file} does not exist")
        self.file = file


class ImportFailed(UserCodeError):
    """The file's or module's top level raised (`SystemExit` included); `file` is None for a module."""

    def __init__(self, location: str, file: Optional[Path], error: BaseException):
        super().__init__(f"{location} failed to import: {describe(error)}")
        self.location, self.file, self.error = location, file, error

    @property
    def cause(self) -> str:
        return describe(self.error)


class MissingAttribute(UserCodeError):
    def __init__(self, spec: UserSpec):
        super().__init__(f"{spec.location} defines no {spec.name!r}")
        self.spec = spec


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def load_attribute(spec: UserSpec, kind: str, folder: Optional[Path] = None) -> Any:
    """The attribute `spec` names (never None), its module imported. A relative file path is read from `folder`
    (default: the working directory); a file's module is named `asyncrl_user_<kind>_<file stem>`."""
    module = import_module(spec, kind, folder)
    value = getattr(module, spec.name, None)
    if value is None:
        raise MissingAttribute(spec)
    return value


def import_module(spec: UserSpec, kind: str, folder: Optional[Path] = None) -> ModuleType:
    if not spec.is_file:
        try:
            return importlib.import_module(spec.location)
        except (Exception, SystemExit) as error:  # sys.exit() at import is a failed import too, not the caller's end
            raise ImportFailed(spec.location, None, error) from None
    file = Path(spec.location)
    if folder is not None and not file.is_absolute():
        file = folder / file
    if not file.is_file():
        raise MissingFile(file)
    module_spec = importlib.util.spec_from_file_location(f"asyncrl_user_{kind}_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:
        raise ImportFailed(spec.location, file, error) from None
    return module
