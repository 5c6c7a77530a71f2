"""Load a reward function from a spec string.

    load_reward_function("path/to/my_reward.py:compute_score")
    load_reward_function("my_package.rewards:compute_score")
    load_reward_function("")            # the built-in dispatcher by data_source

Loading runs the module's top level, which is user code that may hang, exit or fill the memory: only scoring
processes call this (`asyncrl.rewards.process`). The driver checks a spec with `check_reward_function`, which
loads it in a scoring process under a time limit.
"""

from __future__ import annotations

import importlib
import importlib.util
import traceback
from pathlib import Path
from types import ModuleType

from asyncrl.rewards.protocol import RewardFn

BUILTIN = "asyncrl.rewards.builtin:compute_score"


class RewardLoadError(ValueError):
    """A reward function that cannot be loaded; the message names the file or module and the cause. A user
    error: the CLI prints it on one line and exits with status 2."""


def resolve(spec: str) -> str:
    """The spec a scorer loads: an empty one means the built-in dispatcher."""
    return spec or BUILTIN


def load_reward_function(spec: str) -> RewardFn:
    spec = resolve(spec)
    location, sep, name = spec.rpartition(":")
    if not sep or not location or not name:
        raise RewardLoadError(f"reward function {spec!r} must look like 'path/to/file.py:function' "
                              f"or 'package.module:function'")
    module = load_file(Path(location)) if location.endswith(".py") else load_module(spec, location)
    function = getattr(module, name, None)
    if function is None:
        raise RewardLoadError(f"reward function {spec!r}: {location} defines no {name!r}")
    if not callable(function):
        raise RewardLoadError(f"reward function {spec!r}: {name!r} in {location} is not callable")
    return function


def load_module(spec: str, location: str) -> ModuleType:
    try:
        return importlib.import_module(location)
    except ImportError as error:
        raise RewardLoadError(f"reward function {spec!r}: cannot import module {location!r}: {error}") from None
    except (Exception, SystemExit) as error:  # sys.exit() at import is a failed import too, not the scorer's end
        raise RewardLoadError(f"reward function {spec!r}: module {location!r} failed to import: "
                              f"{last_line(error)}") from None


def load_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise RewardLoadError(f"reward function file {path} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"asyncrl_user_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:
        raise RewardLoadError(f"reward function file {path} failed to import: {last_line(error)}"
                              f"{where_in(path, error)}") from None
    return module


def last_line(error: BaseException) -> str:
    """What a traceback's last line says: `ZeroDivisionError: division by zero`, `MemoryError` (notes left out;
    a SyntaxError's message names its file and line)."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def where_in(path: Path, error: BaseException) -> str:
    """` (line N)` of the deepest frame of the traceback that ran in `path`, so the user finds the line."""
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
             if Path(frame.filename).resolve() == path.resolve()]
    return f" (line {lines[-1]})" if lines else ""
