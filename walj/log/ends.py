"""A segment's verified header and seal, read without scanning its records."""

from __future__ import annotations

import os

from ..errors import CorruptionError, UnsupportedVersionError
from . import format as fmt
from .format import SEAL_LINE_LIMIT
from .fs import FileSystem

__all__ = ["read_ends", "read_header"]


def _header_of(head: bytes) -> fmt.Header | None:
    line = head.split(b"\n", 1)[0]
    if len(line) == len(head) or not fmt.checksum_ok(line):
        return None
    try:
        return fmt.parse_header(line)
    except UnsupportedVersionError:
        return None


def read_header(fs: FileSystem, directory: str, name: str) -> fmt.Header | None:
    """The verified header of a segment, read without scanning the rest; None if unreadable
    (a file that is not a regular one included)."""
    try:
        fd = fs.open_read(os.path.join(directory, name))
    except CorruptionError:
        return None
    try:
        head = fs.pread(fd, fmt.HEADER_LINE_LIMIT, 0)
    finally:
        fs.close(fd)
    return _header_of(head)


def read_ends(fs: FileSystem, directory: str, name: str) -> tuple[fmt.Header | None,
                                                                  fmt.Seal | None]:
    """A segment's verified header and, when its last line is a verified seal, that seal: what
    can be checked of a segment without reading its records. None for what is not there."""
    fd = fs.open_read(os.path.join(directory, name))
    try:
        head = fs.pread(fd, fmt.HEADER_LINE_LIMIT, 0)
        size = fs.fstat_size(fd)
        start = max(0, size - SEAL_LINE_LIMIT)
        tail = fs.pread(fd, size - start, start) if size else b""
    finally:
        fs.close(fd)
    header = _header_of(head)
    if not tail.endswith(b"\n"):
        return header, None
    line_start = tail.rfind(b"\n", 0, len(tail) - 1) + 1
    if line_start == 0:  # the window holds one line: too long for a seal, or the header
        return header, None
    line = tail[line_start:-1]
    if not fmt.checksum_ok(line):
        return header, None
    return header, fmt.parse_seal(line)
