"""The replay index: which caller-given call ids this journal settled, bounded in memory.
Standard library only (the forensic tool rebuilds it too)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import NamedTuple

DEFAULT_REPLAY_WINDOW = 10_000
# The filter of call ids that fell out of the window: 2**23 bits (1 MiB, allocated at the
# first eviction) and 4 probes. After a million evictions about 2% of new call ids are
# mistaken for forgotten ones and refused; after 100,000, about 1 in 200,000. The probes come
# from a keyless BLAKE2b of the id, the same in every process: a checkpoint carries the filter
# to the next open (Python's own str hash is salted per process).
_FILTER_BITS = 2**23
_FILTER_MASK = _FILTER_BITS - 1
_PROBES = 4


class SettledCall(NamedTuple):
    """A settled call in the window: its arguments' fingerprint and the record that settled
    it (a tool_execution_finished or tool_execution_resolved), read back when replayed."""

    arguments_sha256: str
    seq: int


class Forgotten(NamedTuple):
    """The call id may have been settled before the window: it is no longer indexed."""

    window: int


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
        settled.pop(call_id, None)  # to the end: the newest
        settled[call_id] = (arguments_sha256, seq)  # type: ignore[assignment] # a SettledCall
        if len(settled) > self.window:
            self._forget(settled.popitem(last=False)[0])

    def unsettle(self, call_id: str) -> None:
        """The call did not take effect (not_performed, rerun): it may run afresh."""
        self.settled.pop(call_id, None)

    def find(self, call_id: str) -> SettledCall | Forgotten | None:
        found = self.settled.get(call_id)
        if found is not None:
            return SettledCall(*found)
        if self._filter is not None and all(
                self._filter[bit >> 3] & (1 << (bit & 7)) for bit in _bits(call_id)):
            return Forgotten(self.window)
        return None

    def filter_bytes(self) -> bytes | None:
        """The filter of forgotten call ids, for a checkpoint; None before the first one."""
        return bytes(self._filter) if self._filter is not None else None

    def load_filter(self, bits: bytes) -> None:
        """Take the filter a checkpoint carried (ValueError if it is not one)."""
        if len(bits) != _FILTER_BITS // 8:
            raise ValueError(f"a filter is {_FILTER_BITS // 8} bytes, not {len(bits)}")
        self._filter = bytearray(bits)

    def _forget(self, call_id: str) -> None:
        bits = self._filter
        if bits is None:
            bits = self._filter = bytearray(_FILTER_BITS // 8)
        # _bits, unrolled (the same probes): this runs for every settled call past the
        # window, on every open.
        value = _hash(call_id)
        bit, step = value & _FILTER_MASK, (value >> 32) | 1
        bits[bit >> 3] |= 1 << (bit & 7)
        bit = (bit + step) & _FILTER_MASK
        bits[bit >> 3] |= 1 << (bit & 7)
        bit = (bit + step) & _FILTER_MASK
        bits[bit >> 3] |= 1 << (bit & 7)
        bit = (bit + step) & _FILTER_MASK
        bits[bit >> 3] |= 1 << (bit & 7)


def _hash(call_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(call_id.encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "little")


def _bits(call_id: str) -> list[int]:
    """The filter's probes for a call id: double hashing over a 64-bit hash."""
    value = _hash(call_id)
    first, step = value & _FILTER_MASK, (value >> 32) | 1
    return [(first + i * step) & _FILTER_MASK for i in range(_PROBES)]
