"""Cutting bytes off a segment without losing them: copy aside with a manifest, then truncate."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

from . import _codec
from ._fs import FileSystem, write_all

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
    """
    qdir = os.path.join(directory, QUARANTINE_DIR)
    if QUARANTINE_DIR not in fs.listdir(directory):
        fs.mkdir(qdir)
        fs.sync_dir(directory)
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    name = f"{segment}.{offset}.{stamp}.bin"
    suffix = 0
    existing = set(fs.listdir(qdir))
    while name in existing:
        suffix += 1
        name = f"{segment}.{offset}.{stamp}.{suffix}.bin"
    digest = hashlib.sha256()
    src = fs.open_read(os.path.join(directory, segment))
    try:
        end = fs.fstat_size(src)
        dst = fs.create(os.path.join(qdir, name))
        try:
            pos = offset
            while pos < end:
                chunk = fs.pread(src, min(_COPY_BYTES, end - pos), pos)
                if not chunk:
                    break
                digest.update(chunk)
                write_all(fs, dst, chunk)
                pos += len(chunk)
            fs.sync(dst)
        finally:
            fs.close(dst)
    finally:
        fs.close(src)
    entry = Quarantined(name, segment, offset, end - offset, kind, digest.hexdigest(), now)
    line = _codec.encode({
        "file": entry.file, "segment": segment, "offset": offset, "length": entry.length,
        "kind": kind, "sha256": entry.sha256, "time": stamp, "unix": now,
    }) + b"\n"
    manifest = os.path.join(qdir, MANIFEST)
    mfd = fs.open_append(manifest) if MANIFEST in existing else fs.create(manifest)
    try:
        write_all(fs, mfd, line)
        fs.sync(mfd)
    finally:
        fs.close(mfd)
    fs.sync_dir(qdir)
    seg_path = os.path.join(directory, segment)
    if offset == 0:
        fs.unlink(seg_path)
        fs.sync_dir(directory)
    else:
        fd = fs.open_append(seg_path)
        try:
            fs.truncate(fd, offset)
            fs.sync(fd)
        finally:
            fs.close(fd)
    return entry
