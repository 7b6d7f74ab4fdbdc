"""Splitting a file into lines: chunked reads through the FileSystem seam, from any offset."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from . import format as fmt
from .fs import FileSystem

__all__ = ["BLOCK_BYTES", "CHUNK_BYTES", "SECTOR", "LineReader", "bad_line_kind", "zero_filled"]

CHUNK_BYTES = 1 << 20
# A segment reader's read: its lines are checked as one block (walj/log/blocks.py). Small
# enough for the block's lines and records to stay in the CPU's caches, and measured faster
# than 1 MiB reads.
BLOCK_BYTES = 1 << 16

SECTOR = 512
_ZERO_SECTOR = bytes(SECTOR)


def _has_zero_sector(line: bytes, offset: int) -> bool:
    """True when the line covers a whole, aligned, all-zero disk sector: how a crash leaves an
    unsynced write that never reached the disk (the file grew, its data did not)."""
    start = -offset % SECTOR
    return any(line[i : i + SECTOR] == _ZERO_SECTOR
               for i in range(start, len(line) - SECTOR + 1, SECTOR))


def zero_filled(pieces: list[bytes], offset: int) -> bool:
    """bad_line_kind's zero test over a line held in pieces (file offset `offset` on), without
    joining them: a sector may straddle two pieces, so up to a sector is carried across."""
    if pieces[0][:1] == b"\0":
        return True
    carry, at = b"", offset
    for piece in pieces:
        data = carry + piece
        if _has_zero_sector(data, at):
            return True
        boundary = (at + len(data)) // SECTOR * SECTOR  # the last sector start in the data
        keep = max(0, boundary - at)
        carry, at = data[keep:], at + keep
    return False


def bad_line_kind(line: bytes, offset: int) -> str:
    # A line never starts with a zero byte: one that does begins where a lost write was.
    if line and (line[0] == 0 or _has_zero_sector(line, offset)):
        return "zero_fill"
    if not line.startswith(fmt.PREFIX) or len(line) <= fmt.BODY_START:
        return "bad_line"
    return "bad_checksum"


class LineReader:
    """The complete lines of an open file from `offset` on, read a chunk at a time through the
    FileSystem seam. Iterating yields batches (file offset of the batch's first line, the
    buffer the lines lie in, the lines without their newlines); a line that spans chunks comes
    alone, as its own buffer. A line longer than `limit()` is never held whole: `oversize`
    gets its offset, and it is skipped to its newline. `on_chunk` sees every byte read.
    The data ends at a line start that holds a zero byte when every byte from there to the
    end of the file is zero: that is space preallocated ahead of the data, and the reading
    stops there (docs/FORMAT.md, *The end of a segment's data*).
    Afterwards `pos` is where the last complete (or skipped) line ends and `held` holds the
    pieces of an incomplete last line, `held_bytes` long."""

    def __init__(self, fs: FileSystem, fd: int, offset: int, limit: Callable[[], int],
                 oversize: Callable[[int], None], *, chunk_bytes: int = CHUNK_BYTES,
                 on_chunk: Callable[[bytes], object] | None = None) -> None:
        self.fs, self.fd, self.limit, self.oversize = fs, fd, limit, oversize
        self.chunk_bytes, self.on_chunk = chunk_bytes, on_chunk
        self.pos = offset
        self.read_at = offset  # where the next sequential read starts
        # The start of a line whose newline has not been read yet, one piece per read: joined
        # once when the newline comes, so a long line costs linear time, not a copy per chunk.
        self.held: list[bytes] = []
        self.held_bytes = 0
        self.skipping = False  # inside an oversize line, discarding up to its newline

    def __iter__(self) -> Iterator[tuple[int, bytes, list[bytes]]]:
        if self.pos:
            self.fs.seek(self.fd, self.pos)
        # Sequential reads: a reader reads each byte of a file once, in order.
        while chunk := self.fs.read(self.fd, self.chunk_bytes):
            self.read_at += len(chunk)
            if b"\0" in chunk:
                chunk = self._settled(chunk)
            if self.on_chunk is not None:
                self.on_chunk(chunk)
            if self.held or self.skipping:
                line, rest = self._finish_line(chunk)
                if line is not None:
                    yield self.pos, line, [line]
                    self.pos += len(line) + 1
                    del line  # let go of a long line before the next read: it is held once
                if rest is None:
                    continue
                chunk = rest
            lines = chunk.split(b"\n")
            tail = lines.pop()
            if lines:
                yield self.pos, chunk, lines
                self.pos += len(chunk) - len(tail)
            del chunk, lines
            if tail:
                if tail[0] == 0 and not self.held:
                    if self._zeros_to_end(tail):
                        return
                    if self.fs.pread(self.fd, len(tail), self.pos) != tail:
                        # A live writer wrote over these zeros since they were read: read
                        # them again, rather than take stale zeros for a hole before data.
                        self.read_at = self.pos
                        self.fs.seek(self.fd, self.pos)
                        continue
                self._hold(tail)

    def _settled(self, chunk: bytes) -> bytes:
        """A chunk holding a zero byte, read again until two reads agree. Beside a live writer,
        zeros read ahead of the data may be written over while they are read (a record copied
        in only in part), and a line never holds a zero byte: a stale zero would turn a good
        record into damage. Bytes that are not zero are never written over, so only a chunk
        with zeros is read twice (in practice, the one at the end of the data)."""
        start = self.read_at - len(chunk)
        for _ in range(3):
            again = self.fs.pread(self.fd, len(chunk), start)
            if again == chunk:
                break
            chunk = again
        if self.read_at != start + len(chunk):  # the file was cut short meanwhile (a seal's trim)
            self.read_at = start + len(chunk)
            self.fs.seek(self.fd, self.read_at)
        return chunk

    def _zeros_to_end(self, tail: bytes) -> bool:
        """Whether `tail`, which ends the bytes read so far, and the rest of the file are all
        zeros (read with pread: the sequential reads are not moved)."""
        if tail.count(0) != len(tail):
            return False
        at = self.pos + len(tail)
        while rest := self.fs.pread(self.fd, self.chunk_bytes, at):
            if rest.count(0) != len(rest):
                return False
            at += len(rest)
        return True

    def _hold(self, piece: bytes) -> None:
        self.held.append(piece)
        self.held_bytes += len(piece)
        if self.held_bytes > self.limit():
            self.oversize(self.pos)
            self.pos += self.held_bytes
            self.held, self.held_bytes, self.skipping = [], 0, True

    def _finish_line(self, chunk: bytes) -> tuple[bytes | None, bytes | None]:
        """Feed `chunk` to the line in progress: (the line, when it ends here and is not being
        skipped; what follows its newline, or None when it does not end here)."""
        nl = chunk.find(b"\n")
        if nl < 0:
            if self.skipping:
                self.pos += len(chunk)
            else:
                self._hold(chunk)
            return None, None
        if self.skipping:
            self.pos += nl + 1
            self.skipping = False
            return None, chunk[nl + 1 :]
        self.held.append(chunk[:nl])
        line = b"".join(self.held)
        self.held, self.held_bytes = [], 0
        return line, chunk[nl + 1 :]


