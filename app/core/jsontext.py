"""JSON read with its nesting capped: text from outside (a --set value, a palette entry, a profile file, a history
row) nested deeper than JSON_MAX_DEPTH is a JsonTooDeep (a ValueError) said in words, never a RecursionError."""

from __future__ import annotations

import json
import re
from typing import Any

from app.core.errors import TunedashError

JSON_MAX_DEPTH = 32  # no server's JSON flag (speculative-config, cuda-graph-config, ...) nests past 3 or 4
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class JsonTooDeep(TunedashError, ValueError):
    """JSON nested deeper than the cap; the message says how deep and the cap."""

    title = "JSON too deep"


def _too_deep(depth: int, max_depth: int) -> JsonTooDeep:
    return JsonTooDeep(f"JSON nested more than {max_depth} levels deep (arrays or objects inside each other); "
                       f"tunedash reads at most {max_depth}: flatten it")


def text_depth(text: str, max_depth: int = JSON_MAX_DEPTH) -> int:
    """How deep JSON `text` nests (strings skipped); stops counting past `max_depth` + 1."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub("", text)):
        depth += 1 if match.group() in "[{" else -1
        if depth > deepest:
            deepest = depth
            if deepest > max_depth:
                break
    return deepest


def value_depth(value: object, max_depth: int = JSON_MAX_DEPTH) -> int:
    """How deep a parsed value (dicts and lists, from TOML or JSON) nests, without recursion; stops past the cap."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > max_depth:
                break
            stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def loads(text: str | bytes, max_depth: int = JSON_MAX_DEPTH) -> Any:
    """json.loads, refusing text nested deeper than `max_depth` (JsonTooDeep) before it is parsed; other bad JSON
    raises json.JSONDecodeError as json.loads does."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    depth = text_depth(text, max_depth)
    if depth > max_depth:
        raise _too_deep(depth, max_depth)
    return json.loads(text)


def check_depth(value: object, max_depth: int = JSON_MAX_DEPTH) -> None:
    """JsonTooDeep when a parsed value nests deeper than `max_depth`."""
    depth = value_depth(value, max_depth)
    if depth > max_depth:
        raise _too_deep(depth, max_depth)
