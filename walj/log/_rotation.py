"""Rotation: which segment is active, creating a segment (header under a temporary name,
synced, renamed, directory synced), growing it ahead of its data, sealing it, and finishing a
rotation an interrupt stopped."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from typing import Any

from ..errors import PoisonedError
from . import format as fmt
from ._durability import WriterState
from .fs import pwrite_all, write_all
from .segment import SegmentScan

_REHASH_BYTES = 1 << 20
# The active segment grows in chunks of zeros written ahead of its data, so that a sync after
# a write into them flushes data alone, not also the file's new size (docs/FORMAT.md, *The end
# of a segment's data*). A chunk is as large as the segment so far, from FIRST_CHUNK up to
# MAX_CHUNK: an open log holds at most MAX_CHUNK of zeros, and a small one FIRST_CHUNK.
FIRST_CHUNK = 16 << 10
MAX_CHUNK = 1 << 20


class Rotation:
    """Moves a WriterState from one segment to the next. Every method but `resume` is called
    with the state's lock held."""

    def __init__(self, state: WriterState, max_record: int, segment_bytes: int) -> None:
        self._state = state
        self._max_record = max_record
        self._segment_bytes = segment_bytes

    def resume(self, last: SegmentScan | None) -> None:
        """On open: append to the last segment found, or start the next one (the first)."""
        st = self._state
        if last is None or last.header is None:
            self.create_segment(1, 1, "")
        elif last.seal is not None:
            st.next_seq = last.seal.last_seq + 1
            self.create_segment(last.header.index + 1, st.next_seq, last.seal.sha256)
        else:
            st.index = last.header.index
            st.next_seq = (last.last_seq or last.header.first_seq - 1) + 1
            st.records = last.records
            st.digest, st.digest_update = last.digest, last.digest.update
            st.offset = last.valid_end
            st.fd = st.fs.open_write(last.path)
            # What lies past the data is zeros (a reader's end of data): space to write into.
            st.allocated = max(st.offset, st.fs.fstat_size(st.fd))
            if last.header.max_record_bytes < self._max_record:
                # Readers bound each line by its segment header's limit: a record the new,
                # larger limit admits must go into a segment whose header says so.
                with st.lock:
                    self.rotate(force=True)
        st.durable_seq = st.next_seq - 1

    def ready(self) -> None:
        """Before a write: raise unless the handle may write now, having finished a rotation
        an interrupt stopped."""
        if self._state.unusable:
            self._state.check_usable()
            self.finish()

    def create_segment(self, index: int, first_seq: int, prev_seal: str) -> None:
        """Write the header under a temporary name, sync, rename, sync the directory. Safe to
        repeat after an interrupt: a leftover temporary or header-only segment is replaced."""
        st = self._state
        st.check_lock()
        name = fmt.segment_name(index)
        final = os.path.join(st.dir, name)
        tmp = final + ".tmp"
        header = fmt.Header(fmt.FORMAT_VERSION, st.log_id, index, first_seq, prev_seal,
                            self._max_record, time.time())
        line = fmt.frame(header.body())
        # The first chunk of zeros goes with the header, covered by the sync the header needs.
        allocated = max(len(line), min(FIRST_CHUNK, self._segment_bytes))
        with contextlib.suppress(FileNotFoundError):
            st.fs.unlink(tmp)
        fd = st.fs.create(tmp)
        try:
            write_all(st.fs, fd, line + bytes(allocated - len(line)))
            st.fs.sync(fd)
            st.fs.rename(tmp, final)
            st.fs.sync_dir(st.dir)
            if index == 1:
                # A directory found without segments may be one whose maker died before it
                # synced the parent: it is durable only once that sync is done.
                st.fs.sync_dir(os.path.dirname(os.path.abspath(st.dir)))
        except BaseException:
            st.fs.close(fd)
            raise
        digest = hashlib.sha256(line)
        old = st.fd
        try:
            self._switch(fd, index, len(line), allocated, digest)
        except BaseException:
            self._switch(fd, index, len(line), allocated, digest)  # an interrupt: it completes
            raise
        finally:
            if old >= 0 and old != fd:
                st.fs.close(old)

    def _switch(self, fd: int, index: int, offset: int, allocated: int, digest: Any) -> None:
        st = self._state
        st.fd, st.index, st.offset, st.records = fd, index, offset, 0
        st.allocated = allocated
        st.digest, st.digest_update = digest, digest.update

    def extend(self, data: bytes, offset: int) -> None:
        """A write of `data` at `offset` that would pass the zeros written ahead: written with
        the next chunk of zeros after it, in one write, which the write's sync covers. An
        interrupt leaves the bytes it wrote, which the caller settles as any write's."""
        st = self._state
        end = offset + len(data)
        start = st.allocated
        step = min(MAX_CHUNK, max(FIRST_CHUNK, start))
        target = max(end, min(start + step, self._segment_bytes))
        pwrite_all(st.fs, st.fd, data + bytes(target - end), offset)
        st.allocated = target

    def trim(self) -> None:
        """Cut the zeros ahead of the data off the active segment (before a seal, and on
        close, so a closed log holds no preallocated space). Safe to repeat: the zeros are
        forgotten only once the truncation returned, so an interrupt before it leaves them
        to the next trim."""
        st = self._state
        if st.allocated != st.offset:
            st.fs.truncate(st.fd, st.offset)
            st.allocated = st.offset

    def trim_for_close(self) -> PoisonedError | None:
        """On close: trim the active segment of a healthy handle. A failure poisons, as any
        failed write does, and is returned for close to raise: the file system's state is
        unknown."""
        st = self._state
        with st.lock:
            if st.fd >= 0 and not st.unusable:
                try:
                    self.trim()
                except OSError as exc:
                    failure = st.poison(exc)
                    failure.__cause__ = exc
                    return failure
        return None

    def rehash(self, size: int) -> Any:
        """The SHA-256 of the active segment's first `size` bytes, read from the file."""
        st = self._state
        digest = hashlib.sha256()
        fd = st.fs.open_read(os.path.join(st.dir, fmt.segment_name(st.index)))
        try:
            pos = 0
            while pos < size:
                chunk = st.fs.pread(fd, min(_REHASH_BYTES, size - pos), pos)
                if not chunk:
                    raise OSError(f"segment ended at {pos} of {size} bytes")
                digest.update(chunk)
                pos += len(chunk)
        finally:
            st.fs.close(fd)
        return digest

    def rotate(self, *, force: bool = False) -> None:
        """Seal the active segment and start the next one (unless, not `force`d, another
        appender already did so)."""
        st = self._state
        while st.syncing:
            st.cond.wait()
        if st.sealed is None:
            if not force and st.offset < self._segment_bytes:
                return  # another appender rotated while this one waited out the sync
            if st.poisoned is not None or st.closed:
                st.check_usable()
            self._write_seal()
        self.finish()

    def _write_seal(self) -> None:
        st = self._state
        st.check_lock()
        offset = st.offset
        last_seq = st.next_seq - 1
        seal = fmt.Seal(last_seq, st.records, st.digest.hexdigest())
        line = fmt.frame(seal.body())
        sealed = (st.index, last_seq, seal.sha256)
        try:
            self.trim()  # a sealed segment holds no zeros: the seal ends the file
            pwrite_all(st.fs, st.fd, line, offset)
            st.allocated = offset + len(line)
            st.sealed = sealed; st.unusable = True  # noqa: E702
        except OSError as exc:
            raise st.poison(exc) from exc
        except BaseException:
            if st.landed(offset, line, "a seal"):
                st.allocated = max(st.allocated, offset + len(line))
                st.sealed = sealed; st.unusable = True  # noqa: E702
            raise

    def finish(self) -> None:
        """If a seal is in the file, sync it and create the next segment. Repeating this after
        an interrupt redoes at most a sync and a header-only file."""
        st = self._state
        if st.sealed is None:
            return
        index, last_seq, sha256 = st.sealed
        try:
            self._sync_seal(index, last_seq)
            self.create_segment(index + 1, last_seq + 1, sha256)
        except OSError as exc:
            raise st.poison(exc) from exc
        st.sealed = None
        st.unusable = st.closed or st.poisoned is not None or st.forked
        st.cond.notify_all()

    def _sync_seal(self, index: int, last_seq: int) -> None:
        st = self._state
        if st.index == index and st.fd >= 0:
            st.fs.sync(st.fd)
            st.durable_seq = last_seq

    def seal_for_close(self) -> None:
        """For close(seal=True): seal the active segment and sync it, and create no next one,
        so that every segment of a finished log is sealed (wholly archivable). A reopen starts
        the next segment, as after a rotation a crash stopped between the seal's sync and the
        next header. Repeating it after an interrupt redoes at most the sync: the handle is
        marked closed before the seal is forgotten."""
        st = self._state
        while st.syncing:
            st.cond.wait()
        if st.sealed is None:
            self._write_seal()
        assert st.sealed is not None  # noqa: S101 - _write_seal set it or raised
        index, last_seq, _ = st.sealed
        try:
            self._sync_seal(index, last_seq)
        except OSError as exc:
            raise st.poison(exc) from exc
        st.closed = st.unusable = True
        st.sealed = None
