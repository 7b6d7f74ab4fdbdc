"""Cutting bytes off a segment without losing them: copy aside with a manifest, then truncate."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import _codec
from ._fs import FileSystem, refuse_hard_link, write_all
from .errors import CorruptionError

QUARANTINE_DIR = "quarantine"
MANIFEST = "MANIFEST.jsonl"
_COPY_BYTES = 1 << 20


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


def cut_segment(
    fs: FileSystem, directory: str, segment: str, offset: int, kind: str
) -> Quarantined:
    """Move the bytes of `segment` from `offset` to its end into the quarantine folder.

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
            _check_quarantine_dir(fs, qdir)
        else:
            fs.mkdir(qdir)
            fs.sync_dir(directory)
        existing = set(fs.listdir(qdir))
        manifest = os.path.join(qdir, MANIFEST)
        if MANIFEST in existing:
            mfd = _open_own(fs, fs.open_append, manifest)
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        name = f"{segment}.{offset}.{stamp}.bin"
        suffix = 0
        while name in existing:
            suffix += 1
            name = f"{segment}.{offset}.{stamp}.{suffix}.bin"
        digest = hashlib.sha256()
        end = fs.fstat_size(src)
        dst = fs.create(os.path.join(qdir, name))
        pos = offset
        while pos < end:
            chunk = fs.pread(src, min(_COPY_BYTES, end - pos), pos)
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


def _open_own(fs: FileSystem, opener: Callable[[str], int], path: str) -> int:
    """Open a regular file (the opener refuses anything else) that has no other hard link."""
    fd = opener(path)
    try:
        refuse_hard_link(path, fs.fstat(fd))
    except BaseException:
        fs.close(fd)
        raise
    return fd


def _check_quarantine_dir(fs: FileSystem, qdir: str) -> None:
    st = fs.stat(qdir)
    if not stat.S_ISDIR(st.st_mode):
        link = stat.S_ISLNK(st.st_mode)
        what = "a symbolic link" if link else "not a directory"
        raise CorruptionError(f"{qdir} is {what}: cut bytes would not stay in the log; refused",
                              file=QUARANTINE_DIR, offset=0,
                              kind="symlink" if link else "not_a_directory")
