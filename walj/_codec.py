"""JSON encode/decode for records: msgspec when installed, the standard library otherwise."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from .errors import SerializationError

try:  # The forensic zipapp runs with the standard library alone.
    import msgspec

    _encoder: msgspec.json.Encoder | None = msgspec.json.Encoder()
    _decoder: msgspec.json.Decoder[Any] | None = msgspec.json.Decoder()
    _DecodeError: type[Exception] = msgspec.DecodeError
except ImportError:  # pragma: no cover - exercised by the zipapp tests
    _encoder = None
    _decoder = None
    _DecodeError = ValueError

HAVE_MSGSPEC = _encoder is not None


MAX_DEPTH = 256  # containers inside containers; deeper records are refused on append


def _find_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def _depth(value: Any) -> int:
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


def _check_depth(value: Any, out: bytes) -> None:
    """Refuse records nested deeper than MAX_DEPTH: reading them back would need the call
    stack that deep again. Counting brackets bounds the depth from above in C, so the walk
    runs only for records with many containers."""
    if out.count(b"[") + out.count(b"{") > MAX_DEPTH and _depth(value) > MAX_DEPTH:
        raise SerializationError(f"record is nested more than {MAX_DEPTH} levels deep")


def _encode_json(value: Any) -> bytes:
    try:
        out = json.dumps(
            value, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"record is not JSON-serializable: {exc}") from exc
    except RecursionError as exc:
        raise SerializationError(f"record is nested too deeply: {exc}") from exc
    _check_depth(value, out)
    return out


def _encode_msgspec(value: Any) -> bytes:
    try:
        out = _msgspec_encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(f"record is not JSON-serializable: {exc}") from exc
    except RecursionError as exc:
        raise SerializationError(f"record is nested too deeply: {exc}") from exc
    _check_depth(value, out)
    # msgspec writes NaN and Infinity as null; a null in the output is the only sign of one.
    if b"null" in out and _find_non_finite(value):
        raise SerializationError("record holds NaN or Infinity, which JSON cannot represent")
    return out


_msgspec_encode = _encoder.encode if _encoder is not None else _encode_json
encode = _encode_msgspec if _encoder is not None else _encode_json
encode.__doc__ = "Compact JSON bytes of `value`; SerializationError for anything JSON cannot hold."


def raw_decoder() -> tuple[Callable[[bytes], Any], type[Exception]]:
    """The fastest decode function and the exception it raises on bad JSON, for hot loops
    that convert that exception themselves."""
    if _decoder is None:
        return json.loads, ValueError
    return _decoder.decode, _DecodeError


def decode(data: bytes | memoryview) -> Any:
    """Parse JSON bytes; ValueError on anything that is not one JSON value."""
    if _decoder is None:
        return json.loads(bytes(data))
    try:
        return _decoder.decode(data)
    except _DecodeError as exc:
        raise ValueError(str(exc)) from exc
