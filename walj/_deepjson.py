"""JSON on a stack of its own: an encoder and a parser for values nested deeper than the
caller's remaining call stack lets a recursive one go (msgspec's and json's both recurse).

Used only as a fallback after a RecursionError, so it is imported only then. Standard library
only: the forensic tools read with it too."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_INF = float("inf")
_SPACE = re.compile(r"[ \t\n\r]*")


class _Raw(str):
    """JSON text the encoder copies as it is: brackets, separators, keys."""


_SCALAR_TEXT: dict[type, Callable[[Any], str]] = {
    int: int.__repr__, float: float.__repr__, bool: lambda flag: "true" if flag else "false",
    type(None): lambda _: "null"}


def dumps(value: Any, sort_keys: bool = False) -> str:
    """What json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=...) writes,
    for a value made of exact dict, list, tuple, str, int, float, bool and None only (one that
    walj._codec.check let through)."""
    quote = json.encoder.encode_basestring
    out: list[str] = []
    work: list[Any] = [value]
    while work:
        item = work.pop()
        kind = type(item)
        if kind is _Raw:
            out.append(item)
        elif kind is str:
            out.append(quote(item))
        elif kind in _SCALAR_TEXT:
            out.append(_SCALAR_TEXT[kind](item))
        elif not item:
            out.append("{}" if kind is dict else "[]")
        elif kind is dict:
            keys = sorted(item) if sort_keys else list(item)
            work.append(_Raw("}"))
            for index in range(len(keys) - 1, -1, -1):
                work.append(item[keys[index]])
                work.append(_Raw(("," if index else "{") + quote(keys[index]) + ":"))
        else:
            work.append(_Raw("]"))
            for index in range(len(item) - 1, -1, -1):
                work.append(item[index])
                work.append(_Raw("," if index else "["))
    return "".join(out)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    number = float(text)
    if not -_INF < number < _INF:
        raise ValueError(f"number {text[:24]} is out of range")
    return number


# Parses one scalar at a time (strings, numbers, literals), which needs no recursion. NaN,
# Infinity and out-of-range numbers are refused, as msgspec refuses them.
_SCALAR = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def loads(data: bytes | memoryview | str) -> Any:
    """Parse exactly one JSON value, with the containers being filled on a list instead of the
    call stack. ValueError for anything else."""
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    skip = _SPACE.match
    scalar = _SCALAR.raw_decode
    filling: list[Any] = []  # the containers being filled, innermost last
    keys: list[str] = []  # for each dict being filled, the key whose value comes next

    def key_at(pos: int) -> int:
        if text[pos : pos + 1] != '"':
            raise ValueError(f"expected a key at character {pos}")
        key, pos = scalar(text, pos)
        pos = _end(skip(text, pos))
        if text[pos : pos + 1] != ":":
            raise ValueError(f"expected ':' at character {pos}")
        keys.append(key)
        return _end(skip(text, pos + 1))

    pos = _end(skip(text))
    while True:
        char = text[pos : pos + 1]
        value: Any
        if char == "{":
            pos = _end(skip(text, pos + 1))
            if text[pos : pos + 1] != "}":
                filling.append({})
                pos = key_at(pos)
                continue
            value, pos = {}, pos + 1
        elif char == "[":
            pos = _end(skip(text, pos + 1))
            if text[pos : pos + 1] != "]":
                filling.append([])
                continue
            value, pos = [], pos + 1
        else:
            value, pos = scalar(text, pos)
        while True:  # put the value in its container; close each container that ends here
            pos = _end(skip(text, pos))
            if not filling:
                if pos != len(text):
                    raise ValueError(f"extra data at character {pos}")
                return value
            container = filling[-1]
            if type(container) is dict:
                container[keys.pop()] = value
                end = "}"
            else:
                container.append(value)
                end = "]"
            char = text[pos : pos + 1]
            if char == ",":
                pos = _end(skip(text, pos + 1))
                pos = key_at(pos) if end == "}" else pos
                break
            if char != end:
                raise ValueError(f"expected ',' or '{end}' at character {pos}")
            pos += 1
            value = filling.pop()


def _end(match: re.Match[str] | None) -> int:
    assert match is not None  # the pattern matches the empty string anywhere
    return match.end()
