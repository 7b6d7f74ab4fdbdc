"""Pure-Python XXH64, to verify log checksums where only the standard library is available.

This follows the XXH64 specification: 32-byte stripes feed four accumulators, which are
then folded together, the remaining 8-, 4- and 1-byte pieces are mixed in one by one, and
an avalanche step finishes the hash. It gives the same results as ``xxhash.xxh64_intdigest``
and ``xxhash.xxh64_hexdigest``, only much more slowly.

Two tricks keep it fast in pure Python, where each arithmetic operation on an int costs
about the same whether the int has 64 bits or 512:

* The four stripe accumulators are kept side by side in one int, one per 128-bit slot
  (accumulator ``i`` in bits ``128*i .. 128*i+63``). Each stripe's four 64-bit lanes are
  spread into the same layout, so one round of the algorithm is a handful of big-int
  operations for all four accumulators at once. A slot is 128 bits wide because a lane
  times a 64-bit prime needs up to 128 bits, so one slot never spills into the next.
* Low bits never depend on higher bits under ``+``, ``*``, ``^``, ``&``, ``|`` and ``<<``.
  So a value can carry junk above bit 63 through those operations, and is masked to
  64 bits only when it has to be exact: before a right shift or a rotation.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from struct import Struct
from typing import Any

__all__ = ["xxh64_hexdigest", "xxh64_intdigest"]

_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5

_MASK64 = 0xFFFFFFFFFFFFFFFF
# The low 64 bits of each of the four 128-bit slots.
_SLOTS = _MASK64 | _MASK64 << 128 | _MASK64 << 256 | _MASK64 << 384
# Multiplying the packed accumulators by this adds up v1 << 1, v2 << 7, v3 << 12 and
# v4 << 18 (the left halves of the four rotations that start the final fold) in the slot
# that begins at bit 384; every cross product lands in another slot.
_FOLD_SHIFTS = 1 << 385 | 1 << 263 | 1 << 140 | 1 << 18

# Copying native 8-byte items moves raw bytes, so byte order does not matter here; only the
# item size does, and 'Q' is 8 bytes on every platform CPython supports.
if array("Q").itemsize != 8:  # pragma: no cover - no such platform is known
    raise ImportError("walj._xxh64 needs array('Q') items of 8 bytes")
_ZERO_LANE = array("Q", bytes(8))

_from_bytes = int.from_bytes

# What is left after the last full stripe (0 to 31 bytes) is up to three 8-byte lanes, at
# most one 4-byte word and up to three single bytes. One precompiled struct per remainder
# length reads all of them in one call: (unpack_from, number of lanes, number of words).
_TAIL: tuple[tuple[Callable[..., tuple[Any, ...]], int, int], ...] = tuple(
    (
        Struct(f"<{rest >> 3}Q{(rest >> 2) & 1}I{rest & 3}B").unpack_from,
        rest >> 3,
        (rest >> 2) & 1,
    )
    for rest in range(32)
)


def _accumulators(seed: int) -> int:
    """The packed starting accumulators: seed + P1 + P2, seed + P2, seed and seed - P1."""
    return (
        ((seed + _P1 + _P2) & _MASK64)
        | ((seed + _P2) & _MASK64) << 128
        | seed << 256
        | ((seed - _P1) & _MASK64) << 384
    )


_ACCUMULATORS_SEED_0 = _accumulators(0)


def xxh64_intdigest(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """XXH64 of `data` as an int; the seed is taken modulo 2**64, as `xxhash` does."""
    buf: bytes = data if type(data) is bytes else memoryview(data).tobytes()
    n = len(buf)
    seed &= _MASK64
    m = _MASK64
    p1 = _P1
    p2 = _P2
    p4 = _P4
    acc: int
    striped = n & ~31  # bytes covered by full 32-byte stripes
    if striped:
        slots = _SLOTS
        # Every 8-byte lane followed by 8 zero bytes: read as one little-endian int, each
        # 64-byte piece of this is a stripe's four lanes in the four 128-bit slots.
        spread = _ZERO_LANE * (striped >> 2)
        spread[::2] = array("Q", buf[:striped])
        wide = spread.tobytes()
        accs = _accumulators(seed) if seed else _ACCUMULATORS_SEED_0
        for start in range(0, striped << 1, 64):
            # round(acc, lane) = rotl(acc + lane * P2, 31) * P1, in all four slots at once.
            x = (accs + _from_bytes(wide[start : start + 64], "little") * p2) & slots
            accs = ((x << 31 | x >> 33) & slots) * p1 & slots
        # acc = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18). The left halves
        # (v << r) come from one multiplication; each right half (v >> (64 - r)) is one shift,
        # as the 64 zero bits above every slot keep the next slot clear of bits 0..63. Each
        # term has junk above bit 63, which a later mask drops.
        acc = (
            (accs * _FOLD_SHIFTS >> 384)
            + (accs >> 63)
            + (accs >> 185)
            + (accs >> 308)
            + (accs >> 430)
        )
        # merge(acc, v) = (acc ^ round(0, v)) * P1 + P4, for v1..v4 in turn. The four
        # round(0, v) are again done side by side, the last product left unmasked as it still
        # fits its slot; x >> 128*i brings the i-th to the bottom, and ^ only needs its low
        # 64 bits. (`a * p1 + p4 ^ b` reads as `(a * p1 + p4) ^ b`.)
        x = accs * p2 & slots
        x = ((x << 31 | x >> 33) & slots) * p1
        acc = (((acc ^ x) * p1 + p4 ^ x >> 128) * p1 + p4 ^ x >> 256) * p1 + p4 ^ x >> 384
        acc = acc * p1 + p4 + n
    else:
        acc = seed + _P5 + n

    unpack, lanes, words = _TAIL[n - striped]
    rest = unpack(buf, striped)
    if lanes:
        for lane in rest[:lanes]:
            x = lane * p2 & m
            x = (acc ^ (x << 31 | x >> 33) * p1) & m
            acc = (x << 27 | x >> 37) * p1 + p4
        rest = rest[lanes:]
    if words:
        x = (acc ^ rest[0] * p1) & m
        acc = (x << 23 | x >> 41) * p2 + _P3
        rest = rest[1:]
    for byte in rest:
        x = (acc ^ byte * _P5) & m
        acc = (x << 11 | x >> 53) * p1

    acc &= m
    acc ^= acc >> 33
    acc = acc * p2 & m
    acc ^= acc >> 29
    acc = acc * _P3 & m
    return acc ^ acc >> 32


def xxh64_hexdigest(data: bytes | bytearray | memoryview, seed: int = 0) -> str:
    """XXH64 of `data` as 16 lowercase hex digits, zero-padded."""
    return f"{xxh64_intdigest(data, seed):016x}"
