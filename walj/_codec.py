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


def _find_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_find_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_find_non_finite(v) for v in value)
    return False


def _encode_json(value: Any) -> bytes:
    try:
        return json.dumps(
            value, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"record is not JSON-serializable: {exc}") from exc


def _encode_msgspec(value: Any) -> bytes:
    try:
        out = _msgspec_encode(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(f"record is not JSON-serializable: {exc}") from exc
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
