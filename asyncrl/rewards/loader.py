"""Load a reward function from a spec string.

    load_reward_function("path/to/my_reward.py:compute_score")
    load_reward_function("my_package.rewards:compute_score")
    load_reward_function("")            # the built-in dispatcher by data_source
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from asyncrl.rewards.protocol import RewardFn

BUILTIN = "asyncrl.rewards.builtin:compute_score"


class RewardLoadError(ValueError):
    """A reward-function spec that does not resolve; the message names the file or module and the name."""


def load_reward_function(spec: str) -> RewardFn:
    spec = spec or BUILTIN
    location, sep, name = spec.rpartition(":")
    if not sep or not location or not name:
        raise RewardLoadError(f"reward function {spec!r} must look like 'path/to/file.py:function' "
                              f"or 'package.module:function'")
    if location.endswith(".py"):
        module = load_file(Path(location))
    else:
        try:
            module = importlib.import_module(location)
        except ImportError as error:
            raise RewardLoadError(f"reward function {spec!r}: cannot import module {location!r}: {error}") from None
    function = getattr(module, name, None)
    if function is None:
        raise RewardLoadError(f"reward function {spec!r}: {location} defines no {name!r}")
    if not callable(function):
        raise RewardLoadError(f"reward function {spec!r}: {name!r} in {location} is not callable")
    return function


def load_file(path: Path):
    if not path.is_file():
        raise RewardLoadError(f"reward function file {path} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"asyncrl_user_reward_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        raise RewardLoadError(f"reward function file {path} failed to import: "
                              f"{type(error).__name__}: {error}") from None
    return module
