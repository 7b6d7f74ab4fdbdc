"""Pristine logs as bytes, and the independent expectations the damage tests hold them to."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import walj

PREFIX_LEN = len(b'{"xxh64":"')


@dataclass
class Image:
    """A closed log, as {file name: bytes}, with the records it holds."""

    files: dict[str, bytes]
    records: list[dict[str, Any]]

    @property
    def segments(self) -> list[str]:
        return sorted(n for n in self.files if n.startswith("seg-"))

    def write(self, path: Path, **changes: bytes | None) -> Path:
        """Materialise the image in a fresh directory, with some files replaced or removed."""
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(mode=0o700)
        files = {**self.files, **changes}
        for name, data in files.items():
            if data is not None:
                fd = os.open(path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, data)
                finally:
                    os.close(fd)
        return path


def build(path: Path, records: list[dict[str, Any]], segment_bytes: int,
          active_records: int) -> Image:
    """A log whose last (active) segment holds exactly `active_records` records."""
    with walj.Log.open(path, segment_bytes=segment_bytes) as log:
        for record in records:
            log.append(record)
        # Keep appending filler until the active segment holds the records asked for.
        names = sorted(p.name for p in path.iterdir() if p.name.startswith("seg-"))
        last = (path / names[-1]).read_bytes().count(b"\n") - 1
        i = 0
        while last != active_records:
            # About 130 bytes a line: 110 of them fill over 12 KiB of a 16 KiB segment (the
            # 4 KiB-block cases need that) whatever the seed, and still fit in it.
            filler = {"filler": i, "pad": "f" * (62 - len(str(i)))}
            log.append(filler)
            records.append(filler)
            i += 1
            names = sorted(p.name for p in path.iterdir() if p.name.startswith("seg-"))
            last = (path / names[-1]).read_bytes().count(b"\n") - 1
    files = {p.name: p.read_bytes() for p in path.iterdir() if p.name.startswith("seg-")}
    return Image(files, records)


def lines_of(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each line, end just past its newline."""
    out = []
    start = 0
    while start < len(data):
        nl = data.find(b"\n", start)
        end = len(data) if nl < 0 else nl + 1
        out.append((start, end))
        start = end
    return out


def expected_flip(data: bytes, pos: int) -> tuple[int, str, bool]:
    """For a bit flip at `pos` (making neither a newline nor a NUL): the offset of the first bad
    line, its problem kind, and whether no complete line follows it (a possible torn tail)."""
    lines = lines_of(data)
    i = next(n for n, (s, e) in enumerate(lines) if s <= pos < e)
    start, end = lines[i]
    last = i == len(lines) - 1
    if pos == end - 1:  # the newline itself: this line runs into the next
        if last:
            return start, "incomplete_line", True
        return start, "bad_header" if start == 0 else "bad_checksum", i + 1 == len(lines) - 1
    if start == 0:
        return 0, "bad_header", last
    if pos - start < PREFIX_LEN:
        return start, "bad_line", last
    return start, "bad_checksum", last


def flip_bit(data: bytes, pos: int, bit_choice: int) -> bytes:
    """Flip one bit of the byte at `pos`, the `bit_choice`-th (mod 8) that yields neither a
    newline nor a NUL."""
    bits = [b for b in range(8) if (data[pos] ^ (1 << b)) not in (0x0A, 0x00)]
    changed = data[pos] ^ (1 << bits[bit_choice % len(bits)])
    return data[:pos] + bytes([changed]) + data[pos + 1 :]


def records_before(image: Image, segment: str, offset: int) -> int:
    """How many records (complete data lines) precede byte `offset` of `segment`."""
    count = 0
    for name in image.segments:
        data = image.files[name]
        if name == segment:
            return count + data_lines(data[:offset])
        count += data_lines(data)
    raise KeyError(segment)


def data_lines(data: bytes) -> int:
    """Complete lines whose body starts with "seq" (FORMAT.md: 28 bytes of prefix and checksum)."""
    return sum(1 for s, e in lines_of(data)
               if data[e - 1 : e] == b"\n" and data[s + 28 : s + 34] == b'"seq":')
