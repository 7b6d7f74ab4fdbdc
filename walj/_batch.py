"""Encoding and decoding a batch of records at once: one check and C-level maps over the
batch, with walj._codec's one-by-one functions (its rules, its errors) for anything else."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._codec import CONVERT, HAVE_MSGSPEC, MAX_DEPTH, _encode_plain, _parse, _scan

__all__ = ["block_parser", "encode_dicts"]


def block_parser() -> Callable[[bytes], Any]:
    """The installed parser itself, for a loop that maps it over many values in one C-level
    call; on any exception it raises (bad JSON, a record too deep for the call stack), the
    loop parses those values again one by one with `_codec.raw_decoder`'s function."""
    return _parse


def encode_dicts(values: list[Any]) -> list[bytes] | None:
    """`_codec.encode` of each of a batch of records, in one pass: when every value is an
    exact dict of exact types, one walk checks them all and one C-level map encodes them.
    None when any needs more (not a dict, a subclass, a refusal, a record too deep for the
    call stack, an encoder error): `encode` each one then, which converts or says what and
    where."""
    if not HAVE_MSGSPEC or set(map(type, values)) != {dict}:
        return None
    try:
        if _scan(values, 0, MAX_DEPTH) & CONVERT:  # the list at level 0: records at 1
            return None
        return list(map(_encode_plain, values))
    except Exception:  # noqa: BLE001 - any refusal: the one-by-one path raises it exactly
        return None
