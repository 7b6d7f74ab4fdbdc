"""The replay index: which caller-given call ids this journal settled, bounded in memory.
Standard library only (the forensic tool rebuilds it too)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

DEFAULT_REPLAY_WINDOW = 10_000
# The filter of call ids that fell out of the window: 2**23 bits (1 MiB, allocated at the
# first eviction) and 4 probes. After a million evictions about 2% of new call ids are
# mistaken for forgotten ones and refused; after 100,000, fewer than 1 in 100,000.
_FILTER_BITS = 2**23
_PROBES = 4

# How an intent's bytes name its call (the journal writes these fields in this order, and a
# JSON string cannot hold `,"` unescaped, so the first match is the field itself).
_CALL_ID = b',"call_id":"'
_GENERATED = b',"call_id_generated":true'
_SHA = b',"arguments_sha256":"'
_SHA_LEN = 64


class SettledCall(NamedTuple):
    """A settled call in the window: its arguments' fingerprint and the record that settled
    it (a tool_execution_finished or tool_execution_resolved), read back when replayed."""

    arguments_sha256: str
    seq: int


class Forgotten(NamedTuple):
    """The call id may have been settled before the window: it is no longer indexed."""

    window: int


def call_key(record: Mapping[str, Any]) -> tuple[str, str] | None:
    """(call id, arguments_sha256) of a decoded intent with a caller-given call id, else None."""
    call_id, sha = record.get("call_id"), record.get("arguments_sha256")
    if record.get("call_id_generated") is True or not isinstance(call_id, str) or not call_id:
        return None
    return (call_id, sha) if isinstance(sha, str) else None


def raw_call_key(data: bytes) -> tuple[str, str] | None | Literal[False]:
    """As call_key, from an intent's JSON bytes as the journal writes them; False when they
    are not in that form (the caller then decodes them)."""
    start = data.find(_CALL_ID)
    if start < 0:
        return False
    start += len(_CALL_ID)
    end = data.find(b'"', start)
    text = data[start:end]
    if end < 0 or b"\\" in text:
        return False
    if data.startswith(_GENERATED, end + 1):
        return None
    sha_at = end + 1
    if not data.startswith(_SHA, sha_at):
        return False
    sha_at += len(_SHA)
    sha = data[sha_at:sha_at + _SHA_LEN]
    if len(sha) != _SHA_LEN or data[sha_at + _SHA_LEN:sha_at + _SHA_LEN + 1] != b'"':
        return False
    try:
        call_id = text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return (call_id, sha.decode("latin-1")) if call_id else None


class CallIndex:
    """The last `window` settled calls by call id, oldest first, and a fixed-size filter of
    the ids that fell out. Memory does not grow with the log."""

    __slots__ = ("window", "settled", "_filter")

    def __init__(self, window: int = DEFAULT_REPLAY_WINDOW) -> None:
        self.window = window
        self.settled: OrderedDict[str, SettledCall] = OrderedDict()
        self._filter: bytearray | None = None

    def settle(self, call_id: str, arguments_sha256: str, seq: int) -> None:
        settled = self.settled
        if call_id in settled:
            del settled[call_id]
        settled[call_id] = SettledCall(arguments_sha256, seq)
        if len(settled) > self.window:
            self._forget(settled.popitem(last=False)[0])

    def unsettle(self, call_id: str) -> None:
        """The call did not take effect (not_performed, rerun): it may run afresh."""
        self.settled.pop(call_id, None)

    def find(self, call_id: str) -> SettledCall | Forgotten | None:
        found = self.settled.get(call_id)
        if found is not None:
            return found
        if self._filter is not None and all(
                self._filter[bit >> 3] & (1 << (bit & 7)) for bit in _bits(call_id)):
            return Forgotten(self.window)
        return None

    def _forget(self, call_id: str) -> None:
        if self._filter is None:
            self._filter = bytearray(_FILTER_BITS // 8)
        for bit in _bits(call_id):
            self._filter[bit >> 3] |= 1 << (bit & 7)


def _bits(call_id: str) -> list[int]:
    digest = hashlib.blake2b(call_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return [int.from_bytes(digest[i * 4:i * 4 + 4], "little") % _FILTER_BITS
            for i in range(_PROBES)]
