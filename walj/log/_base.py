"""The base marker: the durable record of where a compacted log now begins (`BASE`)."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from .. import _codec
from ..errors import CorruptionError
from . import format as fmt
from .format import BASE_NAME, BASE_TAG, BASE_TMP
from .fs import FileSystem, not_regular, write_all
from .segment import Problem, read_ends

# One line of four short fields; anything longer is not a marker walj wrote.
BASE_LIMIT = 1024
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class Base:
    """Where a log begins after `Log.drop_before`: its first kept segment's index, that
    segment's first seq, the seal digest of the last dropped segment (which the kept segment's
    header repeats as `prev`), and the log's id."""

    log_id: str
    index: int
    first_seq: int
    prev_seal: str

    def line(self) -> bytes:
        fields = {"v": fmt.FORMAT_VERSION, "log": self.log_id, "seg": self.index,
                  "first": self.first_seq, "prev": self.prev_seal}
        return fmt.frame(BASE_TAG + _codec.encode(fields) + b"}")


def _bad(why: str) -> CorruptionError:
    return CorruptionError(f"{BASE_NAME}: {why}; the log's start cannot be trusted, refused",
                           file=BASE_NAME, offset=0, kind="bad_base")


def parse_base(data: bytes) -> Base:
    """The marker in `data` (a whole BASE file), or CorruptionError (kind `bad_base`)."""
    fields = _base_fields(data)
    log_id, index, first, prev = (fields.get(k) for k in ("log", "seg", "first", "prev"))
    if not (isinstance(log_id, str) and _HEX32.match(log_id)):
        raise _bad("log id is not 32 hex digits")
    for name, value in (("seg", index), ("first", first)):
        if type(value) is not int or value < 2:
            raise _bad(f"{name} must be an integer of at least 2")
    if not (isinstance(prev, str) and _HEX64.match(prev)):
        raise _bad("prev is not a SHA-256 digest")
    assert isinstance(index, int) and isinstance(first, int)  # noqa: S101 - checked above
    return Base(log_id, index, first, prev)


def _base_fields(data: bytes) -> dict[str, object]:
    """The fields of the one verified base line `data` holds, of this format version."""
    if len(data) >= BASE_LIMIT:
        raise _bad("longer than any marker walj writes")
    if not data.endswith(b"\n") or data.count(b"\n") != 1:
        raise _bad("not exactly one complete line")
    line = data[:-1]
    if not fmt.checksum_ok(line):
        raise _bad("checksum does not match")
    if line[fmt.BODY_START:fmt.BODY_START + len(BASE_TAG)] != BASE_TAG or not line.endswith(b"}"):
        raise _bad("not a base line")
    try:
        fields = _codec.decode(line[fmt.BODY_START + len(BASE_TAG):-1])
    except ValueError as exc:
        raise _bad(f"not JSON ({exc})") from None
    if not isinstance(fields, dict) or fields.get("v") != fmt.FORMAT_VERSION:
        raise _bad("unknown marker version")
    return fields


def read_base(fs: FileSystem, directory: str) -> Base | None:
    """The log's base marker, None when it has none. A marker that is not a regular file (a
    symlink, a FIFO) or does not verify raises CorruptionError: the log's start is unknown."""
    path = os.path.join(directory, BASE_NAME)
    try:
        fd = fs.open_read(path)  # refuses a symlink or a FIFO without blocking
    except FileNotFoundError:
        return None
    try:
        data = fs.pread(fd, BASE_LIMIT, 0)
    finally:
        fs.close(fd)
    return parse_base(data)


def write_base(fs: FileSystem, directory: str, base: Base) -> None:
    """Replace BASE atomically and durably: the line to BASE.tmp, sync it, rename it over
    BASE, sync the directory. Only after this returns may a dropped segment be unlinked."""
    tmp = os.path.join(directory, BASE_TMP)
    try:
        st = fs.stat(tmp)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(tmp, st)  # not something a drop left: refuse, remove nothing
        fs.unlink(tmp)  # a drop that died before its rename left it
    fd = fs.create(tmp)
    try:
        write_all(fs, fd, base.line())
        fs.sync(fd)
    finally:
        fs.close(fd)
    fs.rename(tmp, os.path.join(directory, BASE_NAME))
    fs.sync_dir(directory)


@dataclass
class Start:
    """Where a reader begins: the marker (None: at segment 1), the segments below it that an
    interrupted drop left (never read), the problems the marker itself shows."""

    base: Base | None
    leftovers: list[str]
    problems: list[Problem]


def find_start(fs: FileSystem, directory: str, listed: list[tuple[int, str]]) -> Start:
    """Read BASE and split `listed` (index order) at it: segments below the base are leftovers
    of a drop that a crash or an interrupt stopped between the marker and the last unlink. The
    leftover just below the base, if still there, must be the segment whose seal the marker
    names; a marker that names no kept segment is a missing segment."""
    try:
        base = read_base(fs, directory)
    except CorruptionError as exc:
        return Start(None, [], [Problem(BASE_NAME, 0, None, exc.kind or "bad_base", str(exc))])
    if base is None:
        return Start(None, [], [])
    leftovers = [name for index, name in listed if index < base.index]
    problems: list[Problem] = []
    if not any(index >= base.index for index, _ in listed):
        problems.append(Problem(BASE_NAME, 0, base.first_seq, "missing_segment",
                                f"{BASE_NAME} names segment {base.index}, which is missing"))
    below = [name for index, name in listed if index == base.index - 1]
    if below and not _sealed_as_named(fs, directory, below[0], base):
        problems.append(Problem(BASE_NAME, 0, base.first_seq, "base_mismatch",
                                f"{below[0]}, left below the base, is not the segment "
                                f"whose seal {BASE_NAME} names"))
    return Start(base, leftovers, problems)


def _sealed_as_named(fs: FileSystem, directory: str, name: str, base: Base) -> bool:
    """Whether segment `name` is the one whose seal the marker names: same log, that seal,
    ending just before the base's first seq."""
    header, seal = read_ends(fs, directory, name)
    return (header is not None and seal is not None and header.log_id == base.log_id
            and seal.sha256 == base.prev_seal and seal.last_seq == base.first_seq - 1)


def base_mismatch(base: Base, header: fmt.Header, name: str) -> Problem | None:
    """The first kept segment's header must repeat what the marker says of it."""
    if (header.log_id, header.first_seq, header.prev_seal) == (
            base.log_id, base.first_seq, base.prev_seal):
        return None
    return Problem(name, 0, header.first_seq, "base_mismatch",
                   f"header (log {header.log_id}, first seq {header.first_seq}, prev "
                   f"{header.prev_seal[:12]}...) does not match {BASE_NAME} (log {base.log_id}, "
                   f"first seq {base.first_seq}, prev {base.prev_seal[:12]}...)")
