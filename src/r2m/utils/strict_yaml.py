"""YAML for params files: :class:`StrictLoader` refuses a key given twice (PyYAML keeps the last
one silently) and reads ``1e-4`` as a number (YAML 1.2; PyYAML's 1.1 rules make it a string)."""

from __future__ import annotations

import re
from typing import Any

import yaml

# libyaml's parser where PyYAML was built with it (about 10 times faster: the params and photos.yaml are parsed
# whenever an engine plans), else PyYAML's own; the constructor (the checks below) is the same Python code
_BASE = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader


class StrictLoader(_BASE):  # type: ignore[misc, valid-type]
    """``yaml.SafeLoader`` (libyaml's parser when present) that refuses a key given twice in one mapping (instead
    of keeping the last) and reads ``1e-4`` as a number (YAML 1.2; PyYAML's 1.1 rules make it a string)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: merged keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            try:
                line = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                break
            if line != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (first on line {line})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


MAX_DEPTH = 200  # levels of nesting a document may have (params.yaml: 7)
MAX_VALUES = 1_000_000  # values a document may hold once its aliases are expanded (params.yaml: ~2000)


def _check_expanded_size(doc: Any) -> None:
    """Refuse a document whose aliases expand to more than :data:`MAX_VALUES` values (a "billion
    laughs" alias bomb loads in a blink but hangs whatever walks it: validation, copies, digests)."""
    stack, seen = [(doc, 0)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise yaml.YAMLError(f"more than {MAX_VALUES:,} values once its aliases (*name) are expanded; "
                                 "an alias bomb? write the values out")
        if depth > MAX_DEPTH:  # libyaml parses any depth; what walks the document (validation, copies) recurses
            raise yaml.YAMLError(f"nested more than {MAX_DEPTH} levels deep: too deeply to read")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def yaml_load(text: str) -> Any:
    """Parse params YAML with :class:`StrictLoader` (duplicate keys refused, alias bombs and nesting
    too deep to parse are a :class:`yaml.YAMLError`)."""
    try:
        doc = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise yaml.YAMLError("nested too deeply to read (thousands of levels)") from None
    _check_expanded_size(doc)
    return doc
