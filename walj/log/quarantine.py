"""Cutting bytes off a segment without losing them: copy aside with a manifest, then truncate."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import _codec
from ..errors import CorruptionError
from . import format as fmt
from .format import MANIFEST, QUARANTINE_DIR
from .fs import DEFAULT_FS, FileSystem, read_regular, refuse_hard_link, write_all
from .lines import CHUNK_BYTES, LineReader
from .segment import TAIL_KINDS

__all__ = ["MANIFEST_LIMIT", "CutLine", "Quarantined", "check_quarantine_dir", "cut_length",
           "cut_lines", "cut_segment", "manifest_entries", "manifest_entry", "plain_name",
           "read_manifest"]

# A manifest holds one short line per cut; more than this is not a manifest walj wrote.
MANIFEST_LIMIT = 64 << 20


@dataclass(frozen=True)
class Quarantined:
    """Where cut bytes went: the quarantine file, and what, where and when they were cut from."""

    file: str
    segment: str
    offset: int
    length: int
    kind: str
    sha256: str
    time: float

    @property
    def torn_kind(self) -> bool:
        """Cut at what a crash mid-append leaves (recovery's cuts; a repair of a torn tail),
        not at damage further back (the rest of `walj repair`'s cuts)."""
        return self.kind in TAIL_KINDS


def cut_segment(
    fs: FileSystem, directory: str, segment: str, offset: int, kind: str
) -> Quarantined:
    """Move the bytes of `segment` from `offset` to its end into the quarantine folder; zeros
    that end the file (space preallocated ahead of the data) are cut, not copied.

    Order matters for a crash in the middle: the copy and its manifest line are durable (file,
    then folder) before the segment is truncated, so the bytes exist in one place or both.
    A cut at offset 0 removes the segment file itself, then syncs the log folder.

    Refused, with CorruptionError and before anything changes: a segment or manifest that is
    not a regular file or has other hard links (the cut would reach them too), and a
    `quarantine` that is not a real directory (a symlink would put the bytes elsewhere).
    """
    seg_path = os.path.join(directory, segment)
    qdir = os.path.join(directory, QUARANTINE_DIR)
    src = _open_own(fs, fs.open_read, seg_path)
    dst = cut = mfd = -1
    try:
        if offset:
            cut = _open_own(fs, fs.open_append, seg_path)
        if QUARANTINE_DIR in fs.listdir(directory):
            check_quarantine_dir(fs, qdir)
        else:
            fs.mkdir(qdir)
        # Also when it was there: its maker may have died before this sync, and the cut below
        # must not outlive the folder that holds the cut bytes.
        fs.sync_dir(directory)
        existing = set(fs.listdir(qdir))
        manifest = os.path.join(qdir, MANIFEST)
        if MANIFEST in existing:
            mfd = _open_own(fs, fs.open_append, manifest)
            if not _ends_line(fs, manifest):
                write_all(fs, mfd, b"\n")  # end the line a crash tore, so ours stands alone
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        name = f"{segment}.{offset}.{stamp}.bin"
        suffix = 0
        while name in existing:
            suffix += 1
            name = f"{segment}.{offset}.{stamp}.{suffix}.bin"
        digest = hashlib.sha256()
        end = _last_nonzero_end(fs, src, offset, fs.fstat_size(src))
        dst = fs.create(os.path.join(qdir, name))
        pos = offset
        while pos < end:
            chunk = fs.pread(src, min(CHUNK_BYTES, end - pos), pos)
            if not chunk:
                break
            digest.update(chunk)
            write_all(fs, dst, chunk)
            pos += len(chunk)
        fs.sync(dst)
        entry = Quarantined(name, segment, offset, end - offset, kind, digest.hexdigest(), now)
        line = _codec.encode({
            "file": entry.file, "segment": segment, "offset": offset, "length": entry.length,
            "kind": kind, "sha256": entry.sha256, "time": stamp, "unix": now,
        }) + b"\n"
        if mfd < 0:
            mfd = fs.create(manifest)
        write_all(fs, mfd, line)
        fs.sync(mfd)
        fs.sync_dir(qdir)
        if offset == 0:
            fs.unlink(seg_path)
            fs.sync_dir(directory)
        else:
            fs.truncate(cut, offset)
            fs.sync(cut)
    finally:
        for fd in (mfd, dst, cut, src):
            if fd >= 0:
                fs.close(fd)
    return entry


def cut_length(fs: FileSystem, path: str, offset: int) -> int:
    """How many bytes `cut_segment` would move into quarantine from `offset` on."""
    fd = fs.open_read(path)
    try:
        return _last_nonzero_end(fs, fd, offset, fs.fstat_size(fd)) - offset
    finally:
        fs.close(fd)


def _last_nonzero_end(fs: FileSystem, fd: int, offset: int, size: int) -> int:
    """Just past the last non-zero byte of the file between `offset` and `size` (`offset`
    when all are zeros), read backwards a chunk at a time."""
    end = size
    while end > offset:
        start = max(offset, end - CHUNK_BYTES)
        chunk = fs.pread(fd, end - start, start)
        kept = len(chunk.rstrip(b"\0"))
        if kept:
            return start + kept
        end = start
    return offset


def _ends_line(fs: FileSystem, path: str) -> bool:
    """True when the file is empty or its last byte ends a line."""
    fd = fs.open_read(path)
    try:
        size = fs.fstat_size(fd)
        return size == 0 or fs.pread(fd, 1, size - 1) == b"\n"
    finally:
        fs.close(fd)


def _open_own(fs: FileSystem, opener: Callable[[str], int], path: str) -> int:
    """Open a regular file (the opener refuses anything else) that has no other hard link."""
    fd = opener(path)
    try:
        refuse_hard_link(path, fs.fstat(fd))
    except BaseException:
        fs.close(fd)
        raise
    return fd


def check_quarantine_dir(fs: FileSystem, qdir: str, *,
                         why: str = "cut bytes would not stay in the log") -> None:
    """Refuse (CorruptionError) a `quarantine` that is a symbolic link or no directory: `why`
    says what it would cost."""
    st = fs.stat(qdir)
    if not stat.S_ISDIR(st.st_mode):
        link = stat.S_ISLNK(st.st_mode)
        what = "a symbolic link" if link else "not a directory"
        raise CorruptionError(f"{qdir} is {what}: {why}; refused", file=QUARANTINE_DIR,
                              offset=0, kind="symlink" if link else "not_a_directory")


@dataclass(frozen=True)
class CutLine:
    """A line of cut bytes whose checksum still verifies: a record that was in the log. `end`
    is where the line ends, counted from the start of the cut."""

    seq: int
    data: bytes
    end: int


def read_manifest(directory: str) -> list[Quarantined]:
    """Every cut the manifest records, oldest first. A line that does not parse is skipped: the
    manifest line is durable before the segment is cut, so a torn one names a cut that was never
    made (the next open makes it again, with a line of its own)."""
    qdir = os.path.join(directory, QUARANTINE_DIR)
    try:
        st = os.lstat(qdir)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(st.st_mode):
        return []  # a writer refuses it when it has to cut (check_quarantine_dir)
    try:
        raw = read_regular(os.path.join(qdir, MANIFEST), MANIFEST_LIMIT)
    except FileNotFoundError:
        return []
    return manifest_entries(raw)


def manifest_entries(manifest: bytes) -> list[Quarantined]:
    """The cuts a manifest's bytes record; lines that do not parse are skipped."""
    return [e for e in map(manifest_entry, manifest.split(b"\n")) if e is not None]


def manifest_entry(line: bytes) -> Quarantined | None:
    try:
        value = _codec.decode(line)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    name, segment, kind, digest = (value.get(k) for k in ("file", "segment", "kind", "sha256"))
    offset, length, unix = value.get("offset"), value.get("length"), value.get("unix")
    if not (isinstance(name, str) and plain_name(name) and isinstance(segment, str)
            and isinstance(kind, str) and isinstance(digest, str)
            and type(offset) is int and offset >= 0 and type(length) is int and length >= 0):
        return None
    when = float(unix) if isinstance(unix, (int, float)) and not isinstance(unix, bool) else 0.0
    return Quarantined(name, segment, offset, length, kind, digest, when)


def plain_name(name: str) -> bool:
    """A file name in the quarantine folder itself: no separator, no `..`, nothing hidden."""
    return bool(name) and "/" not in name and "\0" not in name and not name.startswith(".")


def cut_lines(directory: str, entry: Quarantined, *,
              fs: FileSystem = DEFAULT_FS) -> tuple[list[CutLine], bool]:
    """The lines of a cut whose checksums verify, and whether the quarantine file still holds
    exactly the bytes the manifest says were cut (length and SHA-256). Records only: a header
    or seal line among the cut bytes is framed but holds no record."""
    try:
        fd = fs.open_read(os.path.join(directory, QUARANTINE_DIR, entry.file))
    except FileNotFoundError:
        return [], False
    digest = hashlib.sha256()
    found: list[CutLine] = []
    try:
        # Longer than any line walj writes: not a record, skipped to its end.
        lines = LineReader(fs, fd, 0, lambda: fmt.MAX_RECORD_BYTES_LIMIT + fmt.LINE_OVERHEAD,
                           lambda offset: None, on_chunk=digest.update)
        for pos, _, batch in lines:
            for line in batch:
                pos += len(line) + 1
                record = fmt.parse_data(line) if fmt.checksum_ok(line) else None
                if record is not None:
                    found.append(CutLine(record[0], record[1], pos))
        total = lines.pos + lines.held_bytes
    finally:
        fs.close(fd)
    intact = total == entry.length and digest.hexdigest() == entry.sha256
    return found, intact
