"""YAML for files someone may send you: ``safe_load`` (no code runs) with a bound on alias expansion.

``yaml.safe_load`` never runs code, but aliases let a few hundred bytes stand for billions of nodes (the
"billion laughs" file: each line repeats the one before ten times). PyYAML builds that as a graph of shared
objects in an instant; whatever walks it afterwards (validation, a deep copy, a JSON dump) expands it, and
a 508-byte file took 42 s and 3.7 GB before it was rejected. This loader counts, while composing, how many
nodes every alias stands for, and stops as soon as the aliases of one document would add more than
:data:`DEFAULT_MAX_ALIAS_NODES` nodes (``BERTBLOCKS_MAX_YAML_ALIAS_NODES`` raises it; ``0`` switches it off).
A config that uses anchors to share a few options (a few hundred nodes) is unaffected. A recursive alias
(``&a [*a]``) is refused as well: no config is infinite. Nesting deeper than ``max_depth`` is refused while
composing (PyYAML composes recursively: a file of 100,000 ``[`` would otherwise be a ``RecursionError``).

Files are read through :func:`bertblocks.readers.read_yaml`, which adds the size, UTF-8 and NUL checks.

Example:
    >>> load_yaml("base: &b {num_heads: 4}\\nother: *b")
    {'base': {'num_heads': 4}, 'other': {'num_heads': 4}}
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, SequenceNode

from ..errors import BertBlocksError, InputError

MAX_ALIAS_NODES_ENV = "BERTBLOCKS_MAX_YAML_ALIAS_NODES"
DEFAULT_MAX_ALIAS_NODES = 10_000


class YAMLLimitError(BertBlocksError, ComposerError):
    """A YAML document whose aliases expand past the limit, or refer to themselves."""


def max_alias_nodes() -> int | None:
    """The alias-expansion limit now in force (``None``: no limit)."""
    text = os.environ.get(MAX_ALIAS_NODES_ENV, "").strip().replace("_", "")
    if not text:
        return DEFAULT_MAX_ALIAS_NODES
    try:
        value = int(float(text))
    except ValueError:
        raise InputError(f"{MAX_ALIAS_NODES_ENV}={text!r} is not a number (0 switches the limit off)") from None
    return value if value > 0 else None


class BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that keeps, per composed node, the number of nodes it expands to."""

    def __init__(
        self, stream: str | bytes, limit: int | None = DEFAULT_MAX_ALIAS_NODES, max_depth: int | None = None
    ) -> None:
        super().__init__(stream)
        self.limit = limit
        self.max_depth = max_depth
        self._depth = 0
        self._expanded: dict[int, int] = {}  # id(node) → nodes it stands for, once complete
        self._alias_nodes = 0

    def compose_document(self) -> Node | None:
        self._expanded, self._alias_nodes = {}, 0
        return super().compose_document()  # type: ignore[no-any-return]

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            size = self._expanded.get(id(node))
            if size is None:  # its anchor is still being composed: the alias is inside itself
                raise YAMLLimitError(None, None, "a recursive alias (an anchor used inside itself)", mark)
            self._alias_nodes += size
            if self.limit is not None and self._alias_nodes > self.limit:
                raise YAMLLimitError(
                    None,
                    None,
                    f"aliases expand to more than {self.limit:,} nodes (a 'billion laughs' file?); if the file "
                    f"is yours, raise the limit with {MAX_ALIAS_NODES_ENV}",
                    mark,
                )
            return node
        self._depth += 1
        try:
            if self.max_depth is not None and self._depth > self.max_depth:
                mark = self.peek_event().start_mark
                raise YAMLLimitError(None, None, f"nested more than {self.max_depth} deep", mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is not None:
            self._expanded[id(node)] = 1 + sum(self._expanded.get(id(child), 1) for child in _children(node))
        return node


# PyYAML follows YAML 1.1, where `1e-5` (no dot) is a string; YAML 1.2, and everyone writing a config, reads a
# number. The config's float fields are strict (a string is no rate), so the loader reads it as 1.2 does.
BoundedSafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_yaml(text: str | bytes, max_depth: int | None = None) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, refusing alias bombs (and nesting past ``max_depth``).

    Raises:
        YAMLLimitError: aliases that expand past :func:`max_alias_nodes`, a recursive alias, or nesting past
            ``max_depth`` (a ``yaml.MarkedYAMLError``, so the line and column are in ``problem_mark``).
        yaml.YAMLError: malformed YAML.
    """
    loader = BoundedSafeLoader(text, max_alias_nodes(), max_depth)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
