"""The replay index: which caller-given call ids this journal settled, bounded in memory.
Standard library only (the forensic tool rebuilds it too)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from itertools import repeat
from typing import NamedTuple

DEFAULT_REPLAY_WINDOW = 10_000
# The filter of call ids that fell out of the window: 2**23 bits (1 MiB, allocated at the
# first eviction) and 4 probes. After a million evictions about 2% of new call ids are
# mistaken for forgotten ones and refused; after 100,000, about 1 in 200,000. The probes come
# from a keyless BLAKE2b of the id, the same in every process: a checkpoint carries the filter
# to the next open (Python's own str hash is salted per process).
_FILTER_BITS = 2**23
_FILTER_MASK = _FILTER_BITS - 1
FILTER_BYTES = _FILTER_BITS // 8
_PROBES = 4


class SettledCall(NamedTuple):
    """A settled call in the window: its arguments' fingerprint and the record that settled
    it (a tool_execution_finished or tool_execution_resolved), read back when replayed."""

    arguments_sha256: str
    seq: int


class Forgotten(NamedTuple):
    """The call id may have been settled before the window: it is no longer indexed."""

    window: int


class _Loaded:
    """The settled calls a checkpoint carried, oldest first, kept as the columns it holds them
    in and indexed on the first lookup (an open that never looks one up builds no index). A
    repeated id counts at its last place, as settling it again would put it."""

    __slots__ = ("ids", "shas", "seqs", "_positions", "_oldest")

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.shas: list[str] = []
        self.seqs: list[int] = []
        self._positions: dict[str, int] | None = None
        self._oldest = 0  # no live entry before this place

    def add(self, call_ids: list[str], shas: list[str], seq: int) -> None:
        start = len(self.ids)
        self.ids += call_ids
        self.shas += shas
        self.seqs += repeat(seq, len(call_ids))
        if self._positions is not None:  # already indexed: index these too
            self._positions.update(zip(call_ids, range(start, len(self.ids)), strict=True))

    def positions(self) -> dict[str, int]:
        positions = self._positions
        if positions is None:  # one assignment: an interrupt leaves it unbuilt, or whole
            positions = self._positions = dict(zip(self.ids, range(len(self.ids)),
                                                   strict=True))
        return positions

    def get(self, call_id: str) -> tuple[str, int] | None:
        at = self.positions().get(call_id)
        return None if at is None else (self.shas[at], self.seqs[at])

    def pop_oldest(self) -> str:
        """The oldest live call id, taken out (there is one: the caller checks)."""
        positions, ids, at = self.positions(), self.ids, self._oldest
        while positions.get(ids[at]) != at:
            at += 1
        del positions[ids[at]]
        self._oldest = at + 1
        return ids[at]

    def items(self) -> Iterator[tuple[str, tuple[str, int]]]:
        positions, ids, shas, seqs = self.positions(), self.ids, self.shas, self.seqs
        for at in range(self._oldest, len(ids)):
            if positions.get(ids[at]) == at:
                yield ids[at], (shas[at], seqs[at])


class CallIndex:
    """The last `window` settled calls by call id, oldest first, and a fixed-size filter of
    the ids that fell out. Memory does not grow with the log. The calls a checkpoint carried
    stay in its columns (_Loaded), older than every call settled since."""

    __slots__ = ("window", "_recent", "_loaded", "_filter")

    def __init__(self, window: int = DEFAULT_REPLAY_WINDOW) -> None:
        self.window = window
        self._recent: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._loaded: _Loaded | None = None
        # Bytes as a checkpoint carried them until the first id falls out: then a copy to set.
        self._filter: bytes | bytearray | None = None

    @property
    def settled(self) -> OrderedDict[str, tuple[str, int]]:
        """Every call in the window, oldest first: call id -> (arguments' fingerprint, seq of
        the record that settled it). A copy, for reading (a checkpoint, a compaction)."""
        loaded = self._loaded
        if loaded is None:
            return OrderedDict(self._recent)
        merged = OrderedDict(loaded.items())
        merged.update(self._recent)
        return merged

    def settle(self, call_id: str, arguments_sha256: str, seq: int) -> None:
        recent = self._recent
        loaded = self._loaded
        if loaded is not None:
            loaded.positions().pop(call_id, None)
        recent.pop(call_id, None)  # to the end: the newest
        recent[call_id] = (arguments_sha256, seq)
        if len(recent) > self.window or (
                loaded is not None and len(recent) + len(loaded.positions()) > self.window):
            self._forget_oldest()

    def settle_many(self, call_ids: list[str], shas: list[str], seq: int) -> None:
        """settle(call_id, sha, seq) for each pair in order: a checkpoint's window, kept as its
        columns while nothing was settled since and the window has room for all of them."""
        loaded = self._loaded
        carried = len(loaded.ids) if loaded is not None else 0
        if self._recent or carried + len(call_ids) > self.window:
            for call_id, sha in zip(call_ids, shas, strict=True):
                self.settle(call_id, sha, seq)
            return
        if loaded is None:
            loaded = self._loaded = _Loaded()
        loaded.add(call_ids, shas, seq)

    def unsettle(self, call_id: str) -> None:
        """The call did not take effect (not_performed, rerun): it may run afresh."""
        self._recent.pop(call_id, None)
        if self._loaded is not None:
            self._loaded.positions().pop(call_id, None)

    def find(self, call_id: str) -> SettledCall | Forgotten | None:
        found = self._recent.get(call_id)
        if found is None and self._loaded is not None:
            found = self._loaded.get(call_id)
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
        if len(bits) != FILTER_BYTES:
            raise ValueError(f"a filter is {FILTER_BYTES} bytes, not {len(bits)}")
        self._filter = bits

    def _forget_oldest(self) -> None:
        """Out of the window: the oldest call, the carried ones first."""
        loaded = self._loaded
        if loaded is not None and loaded.positions():
            self._forget(loaded.pop_oldest())
            if not loaded.positions():
                self._loaded = None  # all out: settling takes the plain path again
        else:
            self._forget(self._recent.popitem(last=False)[0])

    def _forget(self, call_id: str) -> None:
        bits = self._filter
        if type(bits) is not bytearray:  # one assignment: an interrupt leaves the filter whole
            bits = self._filter = bytearray(bits if bits is not None else FILTER_BYTES)
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
