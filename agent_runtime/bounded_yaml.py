"""YAML as the runtime reads it: safe types only, and a document that cannot grow past what was written.

A YAML alias (`*a`) repeats the node its anchor (`&a`) names, and PyYAML builds the repeat as a shared reference:
loading is cheap, but whatever walks the result afterwards (validation, a dump, a copy) expands every repeat. Nine
levels of nine aliases each ("billion laughs") is under 500 bytes and expands to 9^9 nodes: a config like that
costs gigabytes and seconds before its validation fails. So every YAML the user hands the runtime (a config file,
a `--set` value) is read here, and the document is refused while it is composed, before anything is built, when

- its aliases repeat more than `MAX_ALIAS_NODES` nodes in all (an alias counts the whole node it repeats, with
  the aliases inside that node expanded): a config repeats a block or two, a bomb repeats millions;
- an alias stands inside the node its anchor names (a recursive document, which no config needs and nothing
  can walk to its end);
- it nests deeper than `MAX_DEPTH` levels (PyYAML composes recursively: deeper would end in a RecursionError).

Each refusal is a `YAMLLimitError` that says what was found, where, and what is accepted. A document written
out in full is not limited here: its size is its file's.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_ALIAS_NODES = 10_000
MAX_DEPTH = 100


class YAMLLimitError(ValueError):
    """A YAML document whose aliases or nesting would make it grow past the limits (see the module docstring)."""


def _where(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "an unknown place"


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, counting while it composes: each node's size with its aliases expanded, the nodes
    the aliases repeat so far, and the depth."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> its node count, aliases expanded; set once it is complete
        self._repeated = 0
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)
            size = self._sizes.get(id(node))
            if size is None:
                raise YAMLLimitError(
                    f"the alias *{event.anchor} at {_where(event.start_mark)} stands inside the node its anchor "
                    "names: a recursive document is refused; an alias may only repeat a node that ends before it"
                )
            self._repeated += size
            if self._repeated > MAX_ALIAS_NODES:
                raise YAMLLimitError(
                    f"the aliases repeat more than {MAX_ALIAS_NODES:,} nodes (past the limit at *{event.anchor}, "
                    f"{_where(event.start_mark)}): aliases nested in aliases multiply (a 'billion laughs' document); "
                    f"aliases may repeat at most {MAX_ALIAS_NODES:,} nodes in all: write the repeated parts out or "
                    "use fewer aliases"
                )
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YAMLLimitError(
                f"the document nests deeper than {MAX_DEPTH} levels (at {_where(self.peek_event().start_mark)}); "
                f"at most {MAX_DEPTH} levels of lists and mappings are accepted"
            )
        node = super().compose_node(parent, index)
        self._depth -= 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = []
        self._sizes[id(node)] = 1 + sum(self._sizes[id(child)] for child in children)
        return node


def load_yaml(text: str) -> Any:
    """`text` as Python data, as `yaml.safe_load` would give it; YAMLLimitError for a document past the limits
    (the module docstring), yaml.YAMLError for one that is not valid YAML."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
