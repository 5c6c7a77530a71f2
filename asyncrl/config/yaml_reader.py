"""YAML as a config reads it: safe, without base-60 numbers, and without silently repeated keys.

    tree = read_yaml(Path("run.yaml"))        # a mapping; ConfigError naming the file on any problem
    value = load_yaml("[1, 2]", "override rollout.n=[1, 2]")

A mapping that repeats a key (a section written twice, a key set twice in one section) is an error naming
the file, the dotted key and both lines: plain YAML keeps the last one, so half of a repeated section would
vanish without a word.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import yaml

from asyncrl.config.errors import ConfigError


class ConfigYamlLoader(yaml.SafeLoader):
    """YAML 1.1 without base-60 numbers: `2:6` (a length range) stays the string it looks like, where the
    plain safe loader reads it as 126."""


INT_TAG, FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
MERGE_TAG = "tag:yaml.org,2002:merge"
ConfigYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (INT_TAG, FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ConfigYamlLoader.add_implicit_resolver(INT_TAG, re.compile(
    r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"), list("-+0123456789"))
ConfigYamlLoader.add_implicit_resolver(FLOAT_TAG, re.compile(
    r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))


def load_yaml(text: str, source: str) -> Any:
    """Parse `text` (from `source`, named in errors); yaml.YAMLError on bad syntax, ConfigError on a repeated
    key."""
    loader = ConfigYamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_unique_keys(node, "", source, set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def check_unique_keys(node: yaml.Node, prefix: str, source: str, visited: set[int]) -> None:
    """Every mapping below `node` names each key once; merged keys (`<<: *defaults`) may be overridden, as YAML
    means them to be. A node reached again through an alias (`*name`) was checked the first time; an alias may
    even point back up, so `visited` also ends the walk."""
    if id(node) in visited:
        return
    visited.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            check_unique_keys(item, f"{prefix}[{index}]", source, visited)
        return
    if not isinstance(node, yaml.MappingNode):
        return
    first_marks: dict[str, yaml.Mark] = {}
    for key_node, value_node in node.value:
        if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = f"{prefix}.{key_node.value}" if prefix else key_node.value
        if key_node.value in first_marks:
            kind = "section" if isinstance(value_node, yaml.MappingNode) else "key"
            raise ConfigError(f"{source}: {kind} {key} appears twice, "
                              f"{where(first_marks[key_node.value], key_node.start_mark)}; YAML would keep only the "
                              f"second: merge them into one")
        first_marks[key_node.value] = key_node.start_mark
        check_unique_keys(value_node, key, source, visited)


def where(first: yaml.Mark, second: yaml.Mark) -> str:
    """'at lines 3 and 7', or 'on line 1 (columns 2 and 20)' for a repeat within one line (a flow mapping)."""
    if first.line == second.line:
        return f"on line {first.line + 1} (columns {first.column + 1} and {second.column + 1})"
    return f"at lines {first.line + 1} and {second.line + 1}"


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    source = f"config file {path}"
    try:
        tree: Optional[Any] = load_yaml(path.read_text(), source)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source} is not valid YAML: {error}") from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{source} must hold a mapping at the top, got {type(tree).__name__}")
    return tree
