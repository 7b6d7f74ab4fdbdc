"""Reading one untrusted journal record: the strict JSON decoder both JSON libraries agree on,
and the checks of its time and turn fields. Standard library only (the forensic tool)."""

from __future__ import annotations

import json
import math
from typing import Any

from .. import _codec

# Every field of every record is untrusted: a checksum proves who framed a line, not what is in
# it. Times before 1970 or after the year 9999 and turn numbers beyond 63 bits are not facts:
# no walj writes them, and showing them would overflow. They read as unknown (None).
MAX_TIME = 253402300799.0  # 9999-12-31 23:59:59 UTC
MAX_TURN = 2**63 - 1


def _no_constant(name: str) -> Any:
    raise ValueError("a non-finite number is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:24]} is out of range")
    return value


def decode_record(data: bytes) -> Any:
    """Parse a record's JSON bytes strictly, the same way with msgspec or the standard library:
    ValueError for anything that is not one JSON value, including NaN, Infinity, a number out of
    range and nesting deeper than the format allows (which would need that much stack)."""
    if _codec.HAVE_MSGSPEC:
        value = _codec.decode(data)
    else:
        try:  # strict UTF-8 first: given bytes, json.loads would also take UTF-16 and surrogates
            value = json.loads(data.decode("utf-8"), parse_constant=_no_constant,
                               parse_float=_finite_float)
        except RecursionError:  # the codec's own-stack parser, as strict
            value = _codec.decode(data)
    if (data.count(b"[") + data.count(b"{") > _codec.MAX_DEPTH
            and _codec._depth(value) > _codec.MAX_DEPTH):
        raise ValueError(f"nested more than {_codec.MAX_DEPTH} levels deep")
    return value


def time_of(value: Any) -> float | None:
    """A record's time, or None when it is not a plausible Unix time."""
    if type(value) is float:
        return value if 0.0 <= value <= MAX_TIME else None
    if type(value) is int and 0 <= value <= MAX_TIME:
        return float(value)
    return None


def turn_number(value: Any) -> int | None:
    return value if type(value) is int and 0 < value <= MAX_TURN else None


def show(value: Any) -> str:
    """A short, safe description of an untrusted value for an error message."""
    if isinstance(value, str):
        return repr(value[:40] + ("..." if len(value) > 40 else ""))
    if type(value) is int and abs(value) < 10**20 or value is None or isinstance(value, bool):
        return repr(value)
    return f"a {type(value).__name__}"
