"""Checking a block of record lines at once: every frame, checksum and seq in a few C calls.

A reader's common case is a block of lines that are all records exactly as a writer frames
them, numbered on from the last. Checking one line at a time costs a dozen Python steps per
line; here the whole block is checked with a handful of calls that loop in C, and the answer
is exactly what the line-by-line check would say of each line. A block that fails it is read
again line by line (walj/log/segment.py), which classifies the problem exactly: this module
only ever says "every line is a good, contiguous record" or "look closer".
"""

from __future__ import annotations

import sys
from array import array
from binascii import hexlify
from operator import itemgetter

from . import format as fmt

__all__ = ["check_block", "data_of"]

_BODY = itemgetter(slice(fmt.BODY_START, None))
_LAST_BYTE = itemgetter(slice(-1, None))
_DIGEST_AT = len(fmt.PREFIX)
_SEQ_AT = fmt.BODY_START + len(fmt.SEQ_TAG)
_DIGITS = 16
_SWAP = sys.byteorder == "little"  # hexlify reads the checksums' bytes most significant first


def _template(digits: int) -> bytes:
    """A record line up to the first byte of its data, checksum and seq left as zeros."""
    return fmt.FRAME_HEAD % 0 + fmt.RECORD_TAG % 0 + b"{" if digits == 1 else (
        fmt.FRAME_HEAD % 0 + fmt.SEQ_TAG + b"0" * digits + fmt.DATA_TAG + b"{")


def check_block(lines: list[bytes], first_seq: int) -> int:
    """Where each line's data starts, when every line of `lines` is a record line exactly as
    a writer frames it, numbered `first_seq` on: prefix, lowercase checksum that matches the
    body, `"seq":N,"data":` with the next seq, data that starts with `{`, a line that ends
    with `}`; else 0 (one of them is not: read them one by one). The same start for every
    line: a block whose seqs change their number of digits is left to the line-by-line path.

    The lines' heads (up to the data's first byte) are joined and compared with what they must
    be, built a column at a time: every expected head has the same length and no actual one is
    longer, so equal joins mean every head is whole and equal to its own expected head."""
    count = len(lines)
    seqs = b"%d" * count % tuple(range(first_seq, first_seq + count))
    digits = len(str(first_seq))
    if not count or len(seqs) != digits * count or first_seq < 0:
        return 0
    template = _template(digits)
    width = len(template)
    heads = b"".join(map(itemgetter(slice(0, width)), lines))
    if len(heads) != width * count:
        return 0
    sums = array("Q", map(fmt.xxh64_intdigest, map(_BODY, lines)))
    if _SWAP:
        sums.byteswap()
    hexed = hexlify(sums)
    expected = bytearray(template * count)
    for column in range(_DIGITS):
        expected[_DIGEST_AT + column :: width] = hexed[column :: _DIGITS]
    for column in range(digits):
        expected[_SEQ_AT + column :: width] = seqs[column :: digits]
    if heads != expected or b"".join(map(_LAST_BYTE, lines)) != b"}" * count:
        return 0
    return width - 1


def data_of(lines: list[bytes], data_at: int) -> list[bytes]:
    """The data of each record line of a block `check_block` passed (it starts at `data_at`)."""
    return list(map(itemgetter(slice(data_at, -1)), lines))
