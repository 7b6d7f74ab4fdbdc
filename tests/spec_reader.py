"""An independent reader of walj logs, written from docs/FORMAT.md alone.

It imports nothing from walj: the standard library's json and hashlib, and the `xxhash`
package for XXH64. The crash tests use it beside walj.read, so that a bug walj's reader shares
with walj's writer (both sides of one misunderstanding) cannot pass unseen.

What it implements, with the FORMAT.md section each rule comes from:

- *Files in a log directory*: segments are `seg-NNNNNNNNNN.jsonl` (10 digits, from 1, in index
  order); every other name (`.tmp`, LOCK, LOCK.owner, quarantine/) is not read.
- *Lines*: a line is `{"xxh64":"` + 16 lowercase hex digits + `",` + body + newline; the
  checksum is XXH64 (seed 0) of the body as stored. A line whose checksum verifies is parsed
  as one JSON object of one of three shapes: header, record, seal.
- *header*: first line of every segment; `v` 1, `log` the same in every segment, `seg` the
  file's index, `first` the seq after the previous segment's last, `prev` the previous seal's
  digest ("" for segment 1), `max_record` 1..268435456 (268435456 = 256 MiB).
- *record*: `seq` up by exactly one across segments from 1; `data` a JSON object; its encoded
  bytes at most the header's `max_record` (see the note below).
- *seal*: last line of every segment but the active one; `last` the last seq in the segment,
  `records` how many it holds, `sha256` of every byte before the seal line; the next header's
  `prev` repeats it. Nothing follows a seal.
- *Compaction*: `BASE`, when present, is one line (under 1024 bytes) framed like the others,
  `{"base":{"v":1,"log":...,"seg":N,"first":S,"prev":<64 hex>}}`, with seg and first at least 2;
  the log then starts at segment N: lower indexes are leftovers and are not read, segment N
  must exist and its header's log, first and prev must equal the marker's. A BASE that is not a
  regular file or does not verify is damage (`bad_base`); a mismatch is damage too (this
  reader names it as the chain or seq check that fails; FORMAT.md does not say which).
  (FORMAT.md also checks a leftover just below the base against the marker; this reader does
  not read leftovers at all.)
- *Recovery*: damage at the end of the last segment with no verified line after it (an
  incomplete line, a line whose checksum fails, zeros, a header that never became valid) is a
  torn tail: its records were never acknowledged, and the log ends before it. So is a crash
  hole: damage that starts with zeros (a line beginning with a zero byte, or covering a whole
  512-byte-aligned zero sector) followed only by torn lines and the records after the seq gap
  it causes. Everything else raises SpecError.
- *The end of a segment's data*: a segment's data ends at the first line start that holds a
  zero byte when every byte from there to the end of the file is zero (space preallocated
  ahead of the data): those zeros are no line, and no problem.

Where FORMAT.md left a choice open, the choice made here is marked "FORMAT.md does not say".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

import xxhash

PREFIX = b'{"xxh64":"'
BODY_START = len(PREFIX) + 16 + 2  # the prefix, 16 hex digits, then `",`
MAX_RECORD_LIMIT = 268435456
SECTOR = 512
SEGMENT_NAME = re.compile(r"seg-(\d{10})\.jsonl")


class SpecError(Exception):
    """Damage: the log is not one walj wrote, or was changed after the crash it claims."""

    def __init__(self, message: str, *, file: str | None = None, offset: int | None = None,
                 kind: str = "damage") -> None:
        super().__init__(f"{file}@{offset}: {message} ({kind})" if file else message)
        self.file = file
        self.offset = offset
        self.kind = kind


@dataclass
class SpecLog:
    """What a log holds: its acknowledged-or-not records in order (seq, data), where a torn
    tail begins (file, offset) if there is one, its segment files and its id."""

    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    torn_tail: tuple[str, int] | None = None
    segments: list[str] = field(default_factory=list)
    log_id: str | None = None


@dataclass
class _Line:
    offset: int
    raw: bytes  # without its newline
    complete: bool  # ended by a newline
    value: dict[str, Any] | None  # parsed, when the checksum verifies and the JSON parses


def _checksum_ok(raw: bytes) -> bool:
    if not raw.startswith(PREFIX) or raw[BODY_START - 2:BODY_START] != b'",':
        return False
    expected = xxhash.xxh64(raw[BODY_START:], seed=0).hexdigest().encode()
    return raw[len(PREFIX):BODY_START - 2] == expected


def _lines(data: bytes) -> list[_Line]:
    lines: list[_Line] = []
    pos = 0
    while pos < len(data):
        if data[pos] == 0 and data.count(0, pos) == len(data) - pos:
            break  # preallocated space: the data ends here
        end = data.find(b"\n", pos)
        complete = end >= 0
        raw = data[pos:end] if complete else data[pos:]
        value = None
        if complete and _checksum_ok(raw):
            try:
                parsed = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                parsed = None
            if isinstance(parsed, dict):
                value = parsed
        lines.append(_Line(pos, raw, complete, value))
        pos = end + 1 if complete else len(data)
    return lines


def _zeros(line: _Line) -> bool:
    """A line that begins with a zero byte, or covers a whole 512-byte-aligned zero sector
    (aligned in the file: FORMAT.md does not say, but a sector is a place on the disk)."""
    if line.raw[:1] == b"\0":
        return True
    first = -(-line.offset // SECTOR) * SECTOR
    end = line.offset + len(line.raw)
    for start in range(first, end - SECTOR + 1, SECTOR):
        rel = start - line.offset
        if line.raw[rel:rel + SECTOR].count(0) == SECTOR:
            return True
    return False


def _shape(value: dict[str, Any]) -> str | None:
    keys = set(value) - {"xxh64"}
    if keys == {"header"} and isinstance(value["header"], dict):
        return "header"
    if keys == {"seq", "data"}:
        return "record"
    if keys == {"seal"} and isinstance(value["seal"], dict):
        return "seal"
    return None


def _is_int(value: Any) -> bool:
    return type(value) is int  # JSON true is not a number here


def _record_bytes(line: _Line) -> int:
    """The encoded size of a record's data: the body is `"seq":N,"data":` + data + `}`.
    FORMAT.md does not say exactly what max_record bounds; this reads it as the data's bytes."""
    start = line.raw.index(b'"data":', BODY_START) + len(b'"data":')
    return len(line.raw) - 1 - start


def read_log(path: str | os.PathLike[str]) -> SpecLog:
    """Read the log directory at `path`; SpecError on damage (see the module docstring)."""
    directory = os.fspath(path)
    found: list[tuple[int, str]] = []
    for name in os.listdir(directory):
        match = SEGMENT_NAME.fullmatch(name)
        if match:
            found.append((int(match.group(1)), name))
    found.sort()
    base = _read_base(directory)
    first_index = base["seg"] if base else 1
    found = [(index, name) for index, name in found if index >= first_index]
    log = SpecLog(segments=[name for _, name in found])
    if base and (not found or found[0][0] != first_index):
        raise SpecError(f"segment {first_index}, named by BASE, is missing", file="BASE",
                        offset=0, kind="missing_segment")
    for position, (index, name) in enumerate(found, start=first_index):
        if index != position:
            raise SpecError(f"segment {position} is missing", file=name, offset=0,
                            kind="missing_segment")
    prev_seal = base["prev"] if base else ""
    next_seq = base["first"] if base else 1
    if base:
        log.log_id = base["log"]
    for position, (index, name) in enumerate(found, start=1):
        last = position == len(found)
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        lines = _lines(data)
        ended, prev_seal, next_seq = _read_segment(log, name, index, data, lines, last,
                                                   prev_seal, next_seq)
        if ended:
            break
    return log


def _read_base(directory: str) -> dict[str, Any] | None:
    """The BASE marker's fields, None without one; SpecError when it is not a verified one."""
    path = os.path.join(directory, "BASE")
    if not os.path.lexists(path):
        return None
    if not stat.S_ISREG(os.lstat(path).st_mode):
        raise SpecError("BASE is not a regular file", file="BASE", offset=0,
                        kind="not_a_regular_file")
    with open(path, "rb") as f:
        data = f.read(1024)
    lines = _lines(data)
    value = lines[0].value if len(lines) == 1 and lines[0].complete else None
    base = value.get("base") if value is not None and list(value) == ["xxh64", "base"] else None
    if not (isinstance(base, dict) and base.get("v") == 1 and len(data) < 1024
            and isinstance(base.get("log"), str) and re.fullmatch(r"[0-9a-f]{32}", base["log"])
            and _is_int(base.get("seg")) and base["seg"] >= 2
            and _is_int(base.get("first")) and base["first"] >= 2
            and isinstance(base.get("prev"), str)
            and re.fullmatch(r"[0-9a-f]{64}", base["prev"])):
        raise SpecError("BASE is not a verified base line", file="BASE", offset=0,
                        kind="bad_base")
    return base


def _read_segment(log: SpecLog, name: str, index: int, data: bytes, lines: list[_Line],
                  last: bool, prev_seal: str,
                  next_seq: int) -> tuple[bool, str, int]:
    """One segment's records into `log`. Returns (the log ends here, its seal, next seq)."""

    def torn_or_damage(at: int, why: str, kind: str) -> None:
        """A problem at line `at`: a torn tail (the log ends there), or else damage."""
        rest = lines[at + 1:]
        if last and (not any(line.value is not None for line in rest)
                     or (_zeros(lines[at]) and _after_hole(rest))):
            log.torn_tail = (name, lines[at].offset)
            return
        raise SpecError(why, file=name, offset=lines[at].offset, kind=kind)

    if not lines:
        if last:  # created and never written (FORMAT.md: "a header that never became valid")
            log.torn_tail = (name, 0)
            return True, prev_seal, next_seq
        raise SpecError("empty segment", file=name, offset=0, kind="bad_header")
    header_line = lines[0]
    if header_line.value is None or _shape(header_line.value) != "header":
        torn_or_damage(0, "first line is not a verified header", "bad_header")
        return True, prev_seal, next_seq
    header = header_line.value["header"]
    if header.get("v") != 1:
        raise SpecError(f"format version {header.get('v')!r}", file=name, offset=0,
                        kind="unsupported_version")
    max_record = header.get("max_record")
    checks = [
        (isinstance(header.get("log"), str) and re.fullmatch(r"[0-9a-f]{32}", header["log"])
         is not None, "bad_header", "log id is not 32 hex digits"),
        (_is_int(header.get("seg")) and header["seg"] == index, "bad_header",
         f"header says segment {header.get('seg')!r}, the file name {index}"),
        (_is_int(max_record) and 1 <= max_record <= MAX_RECORD_LIMIT, "bad_header",
         f"max_record {max_record!r}"),
        (isinstance(header.get("created"), (int, float)) and not isinstance(
            header.get("created"), bool), "bad_header", "created is not a Unix time"),
        (log.log_id is None or header.get("log") == log.log_id, "foreign_segment",
         "segment of another log"),
        (_is_int(header.get("first")) and header["first"] == next_seq, "seq_gap",
         f"first seq {header.get('first')!r}, expected {next_seq}"),
        (header.get("prev") == prev_seal, "seal_chain",
         "prev is not the previous segment's seal digest"),
    ]
    for ok, kind, why in checks:
        if not ok:
            raise SpecError(why, file=name, offset=0, kind=kind)
    log.log_id = header["log"]
    count = 0
    for at in range(1, len(lines)):
        line = lines[at]
        value = line.value
        shape = _shape(value) if value is not None else None
        if value is None or shape is None:
            torn_or_damage(at, "line does not verify", "bad_line")  # raises, or:
            return True, prev_seal, next_seq
        if shape == "header":
            raise SpecError("a second header", file=name, offset=line.offset, kind="bad_line")
        if shape == "seal":
            seal = value["seal"]
            digest = hashlib.sha256(data[:line.offset]).hexdigest()
            if not (_is_int(seal.get("last")) and seal["last"] == next_seq - 1
                    and _is_int(seal.get("records")) and seal["records"] == count):
                raise SpecError(f"seal {seal} does not match the segment ({count} records "
                                f"to seq {next_seq - 1})", file=name, offset=line.offset,
                                kind="seal_mismatch")
            if seal.get("sha256") != digest:
                raise SpecError("seal digest does not match the bytes before it", file=name,
                                offset=line.offset, kind="seal_mismatch")
            if at + 1 < len(lines):
                raise SpecError("data after the seal", file=name,
                                offset=lines[at + 1].offset, kind="data_after_seal")
            return False, digest, next_seq
        seq, record = value["seq"], value["data"]
        if not _is_int(seq) or seq != next_seq:
            raise SpecError(f"seq {seq!r}, expected {next_seq}", file=name, offset=line.offset,
                            kind="seq_gap" if _is_int(seq) and seq > next_seq else "seq_repeat")
        if not isinstance(record, dict):
            raise SpecError("data is not a JSON object", file=name, offset=line.offset,
                            kind="bad_line")
        if _record_bytes(line) > max_record:
            raise SpecError("record longer than the header's max_record", file=name,
                            offset=line.offset, kind="oversize_line")
        log.records.append((seq, record))
        count += 1
        next_seq += 1
    if not last:
        raise SpecError("a segment before the last has no seal", file=name, offset=len(data),
                        kind="unsealed_segment")
    return True, prev_seal, next_seq


def _after_hole(rest: list[_Line]) -> bool:
    """What may follow a crash hole: torn lines, and verified records (whose seqs the hole's
    gap moved on). FORMAT.md does not say whether a seal may follow one (a power cut during a
    rotation, with the seal written and an earlier unsynced record lost): accepted here, as
    physically possible. A header after a hole is not."""
    return all(line.value is None or _shape(line.value) in ("record", "seal", None)
               for line in rest)


def read_records(path: str | os.PathLike[str]) -> list[tuple[int, dict[str, Any]]]:
    """The records of the log at `path`, up to a torn tail; SpecError on damage."""
    return read_log(path).records
