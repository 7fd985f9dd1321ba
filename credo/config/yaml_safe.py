"""The one YAML reader of credo's configuration: ``yaml.SafeLoader`` with a budget on what aliases may expand to.

YAML aliases (``*a``) repeat an anchored node (``&a``) without copying it, so about 1 KB of nested aliases (the
"billion laughs") stands for billions of nodes; PyYAML builds shared Python objects for them, and whatever walks
the config afterwards (``dataclasses.asdict``, a JSON or YAML dump, a deep copy) expands them for minutes and
gigabytes. :func:`load_yaml` therefore composes the node graph first, measures it and constructs Python objects
only from a graph within the budget:

- the text is at most :data:`MAX_YAML_CHARS` characters (a config is a few KB);
- the expanded size, with every alias replaced by a copy of its node, is at most :data:`MAX_EXPANDED_NODES`:
  ``size(scalar) = 1 + len(text) // 100`` (a long string repeated by aliases counts its length),
  ``size(sequence) = 1 + sum(size(item))``, ``size(mapping) = 1 + sum(size(key) + size(value))``; an alias counts
  what its node counts. Sizes are memoised by node identity, so the measure costs one visit per distinct node
  (the graph of aliases is a DAG), never the expansion itself;
- no alias refers to a node that contains it (a recursive alias: its expansion is infinite);
- nesting stays within Python's recursion limit.

Every refusal is a :class:`YamlConfigError` with a one-line message that names ``source``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_YAML_CHARS = 1 << 20  # 1 MiB of text, far above any real config (the presets are 0.5 - 2 KB)
MAX_EXPANDED_NODES = 100_000  # far above any real config (a run's config.yaml is about 400 nodes)
SCALAR_CHARS_PER_NODE = 100  # a scalar counts one node plus one per 100 characters


class YamlConfigError(ValueError):
    """A YAML config refused (past the budget of this module; from :func:`read_mapping` also malformed or not a
    mapping); the message is one line and names the source."""


def load_yaml(text: str, source: str = "<string>") -> Any:
    """``yaml.safe_load(text)``, or :class:`YamlConfigError` naming ``source`` when ``text`` is over
    :data:`MAX_YAML_CHARS` characters, nests past the recursion limit, holds a recursive alias or expands to more
    than :data:`MAX_EXPANDED_NODES` nodes (measured before any Python object is built). Malformed YAML raises
    ``yaml.YAMLError`` as ``yaml.safe_load`` does."""
    if len(text) > MAX_YAML_CHARS:
        raise YamlConfigError(f"{source}: the YAML text is more than {MAX_YAML_CHARS} characters")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node, source)
        return loader.construct_document(node)
    except RecursionError:
        raise YamlConfigError(f"{source}: the YAML nests too deeply") from None
    finally:
        loader.dispose()


def read_mapping(path: Path) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` ({} for an empty file) read by :func:`load_yaml`; malformed YAML
    (with its line), a document that is not a mapping, or one past the budget is a :class:`YamlConfigError`. At
    most one character past :data:`MAX_YAML_CHARS` is read (a huge file is refused without being read whole)."""
    with path.open() as f:
        text = f.read(MAX_YAML_CHARS + 1)
    try:
        data = load_yaml(text, str(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise YamlConfigError(f"{path}{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise YamlConfigError(f"{path}: a config file must be a mapping of keys, got {type(data).__name__}")
    return data


def expanded_size(root: Node, source: str = "<string>", budget: int = MAX_EXPANDED_NODES) -> int:
    """The number of nodes ``root`` stands for with every alias expanded (the rule of the module docstring), or
    :class:`YamlConfigError` as soon as a node's size passes ``budget`` or a node contains itself. Iterative
    depth-first walk: each distinct node is measured once (memo by ``id``), after all of its children."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the nodes on the current path from the root: meeting one again is a cycle
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = _own_size(node) + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > budget:
                raise YamlConfigError(f"{source}: YAML aliases expand to more than {budget} nodes (an alias bomb?)")
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise YamlConfigError(f"{source}: a YAML alias refers to a node that contains it (a recursive alias)")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    return sizes[id(root)]


def _own_size(node: Node) -> int:
    """1 for a collection; ``1 + len(text) // SCALAR_CHARS_PER_NODE`` for a scalar."""
    if isinstance(node, ScalarNode):
        return 1 + len(node.value) // SCALAR_CHARS_PER_NODE
    return 1


def _children(node: Node) -> list[Node]:
    """A sequence's items; a mapping's keys and values, in order; nothing for a scalar."""
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []
