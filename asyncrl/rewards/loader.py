"""Load a reward function from a spec string.

    load_reward_function("path/to/my_reward.py:compute_score")
    load_reward_function("my_package.rewards:compute_score")
    load_reward_function("")            # the built-in dispatcher by data_source

Loading runs the module's top level, which is user code that may hang, exit or fill the memory: only scoring
processes call this (`asyncrl.rewards.process`). The driver checks a spec with `check_reward_function`, which
loads it in a scoring process under a time limit. The import itself is `asyncrl.config.user_code`'s, which loads
tools and agents too; the messages here are the reward function's own.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from asyncrl.config.user_code import ImportFailed, MissingAttribute, MissingFile, UserCodeError, UserSpec, \
    load_attribute, split_spec
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
    parsed = split_spec(spec)
    if parsed is None:
        raise RewardLoadError(f"reward function {spec!r} must look like 'path/to/file.py:function' "
                              f"or 'package.module:function'")
    try:
        function = load_attribute(parsed, kind="reward")
    except UserCodeError as failure:
        raise RewardLoadError(load_failure(spec, parsed, failure)) from None
    if not callable(function):
        raise RewardLoadError(f"reward function {spec!r}: {parsed.name!r} in {parsed.location} is not callable")
    return function


def load_failure(spec: str, parsed: UserSpec, failure: UserCodeError) -> str:
    """The message of a reward function that did not load, naming the file or module and the cause."""
    match failure:
        case MissingFile(file=file):
            return f"reward function file {file} does not exist"
        case ImportFailed(file=Path() as file, error=error):
            return f"reward function file {file} failed to import: {last_line(error)}{where_in(file, error)}"
        case ImportFailed(error=ImportError() as error):
            return f"reward function {spec!r}: cannot import module {parsed.location!r}: {error}"
        case ImportFailed(error=error):
            return f"reward function {spec!r}: module {parsed.location!r} failed to import: {last_line(error)}"
        case MissingAttribute():
            return f"reward function {spec!r}: {parsed.location} defines no {parsed.name!r}"
    raise TypeError(f"no reward wording for {type(failure).__name__}: {failure}")


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
