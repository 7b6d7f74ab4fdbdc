"""Rotation: creating a segment (header under a temporary name, synced, renamed, directory
synced), sealing the active one, and finishing a rotation an interrupt stopped."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import Any

from . import format as fmt
from ._durability import Durability
from .fs import write_all

_REHASH_BYTES = 1 << 20


class Rotation(Durability):
    """The segment half of a Log: which segment is active, and moving on to the next one. The
    Log holds the lock around every call here."""

    _log_id: str
    _max_record: int
    _segment_bytes: int
    _index: int
    _offset: int
    _segment_records: int
    _hash: Any
    _hash_update: Any
    _sealed: tuple[int, int, str] | None
    _cond: threading.Condition

    def _file_size(self) -> int | None:
        raise NotImplementedError

    def _create_segment(self, index: int, first_seq: int, prev_seal: str) -> None:
        """Write the header under a temporary name, sync, rename, sync the directory. Safe to
        repeat after an interrupt: a leftover temporary or header-only segment is replaced."""
        self._check_lock()
        name = fmt.segment_name(index)
        final = os.path.join(self._dir, name)
        tmp = final + ".tmp"
        header = fmt.Header(fmt.FORMAT_VERSION, self._log_id, index, first_seq, prev_seal,
                            self._max_record, time.time())
        line = fmt.frame(header.body())
        try:
            self._fs.unlink(tmp)
        except FileNotFoundError:
            pass
        fd = self._fs.create(tmp)
        try:
            write_all(self._fs, fd, line)
            self._fs.sync(fd)
            self._fs.rename(tmp, final)
            self._fs.sync_dir(self._dir)
            if index == 1:
                # A directory found without segments may be one whose maker died before it
                # synced the parent: it is durable only once that sync is done.
                self._fs.sync_dir(os.path.dirname(os.path.abspath(self._dir)))
        except BaseException:
            self._fs.close(fd)
            raise
        digest = hashlib.sha256(line)
        old = self._fd
        try:
            self._switch(fd, index, len(line), digest)
        except BaseException:
            self._switch(fd, index, len(line), digest)  # an interrupt: the switch completes
            raise
        finally:
            if old >= 0 and old != fd:
                self._fs.close(old)

    def _switch(self, fd: int, index: int, offset: int, digest: Any) -> None:
        self._fd, self._index, self._offset, self._segment_records = fd, index, offset, 0
        self._hash, self._hash_update = digest, digest.update

    def _rehash(self, size: int) -> Any:
        digest = hashlib.sha256()
        fd = self._fs.open_read(os.path.join(self._dir, fmt.segment_name(self._index)))
        try:
            pos = 0
            while pos < size:
                chunk = self._fs.pread(fd, min(_REHASH_BYTES, size - pos), pos)
                if not chunk:
                    raise OSError(f"segment ended at {pos} of {size} bytes")
                digest.update(chunk)
                pos += len(chunk)
        finally:
            self._fs.close(fd)
        return digest

    def rotate(self) -> None:
        """Seal the active segment (the seal synced, which makes every record in it durable)
        and start the next, so the next record appended begins a segment. Does nothing when
        the active segment holds no record yet. Raises as an append would."""
        with self._lock:
            self._ready()
            if self._segment_records:
                self._rotate(force=True)

    def _rotate(self, *, force: bool = False) -> None:
        """Seal the active segment and start the next one. Called with the lock held."""
        while self._syncing:
            self._cond.wait()
        if self._sealed is None:
            if not force and self._offset < self._segment_bytes:
                return  # another appender rotated while this one waited out the sync
            if self._poisoned is not None or self._closed:
                self._check_usable()
            self._write_seal()
        self._finish_rotation()

    def _write_seal(self) -> None:
        self._check_lock()
        offset = self._offset
        last_seq = self._next_seq - 1
        seal = fmt.Seal(last_seq, self._segment_records, self._hash.hexdigest())
        line = fmt.frame(seal.body())
        sealed = (self._index, last_seq, seal.sha256)
        try:
            write_all(self._fs, self._fd, line)
            self._sealed = sealed; self._unusable = True  # noqa: E702
        except OSError as exc:
            raise self._poison(exc) from exc
        except BaseException:
            size = self._file_size()
            if size == offset + len(line):
                self._sealed = sealed; self._unusable = True  # noqa: E702
            elif size is not None and size != offset:
                self._poison_interrupted("a seal was interrupted half written")
            raise

    def _finish_rotation(self) -> None:
        """With the lock held: if a seal is in the file, sync it and create the next segment.
        Repeating this after an interrupt redoes at most a sync and a header-only file."""
        if self._sealed is None:
            return
        index, last_seq, sha256 = self._sealed
        try:
            if self._index == index and self._fd >= 0:
                self._fs.sync(self._fd)
                self._durable_seq = last_seq
            self._create_segment(index + 1, last_seq + 1, sha256)
        except OSError as exc:
            raise self._poison(exc) from exc
        self._sealed = None
        self._unusable = self._closed or self._poisoned is not None or self._forked
        self._cond.notify_all()

    def _seal_for_close(self) -> None:
        """With the lock held, for close(seal=True): seal the active segment and sync it, and
        create no next one, so that every segment of a finished log is sealed (wholly
        archivable). A reopen starts the next segment, as after a rotation a crash stopped
        between the seal's sync and the next header. Repeating it after an interrupt redoes at
        most the sync: the handle is marked closed before the seal is forgotten."""
        while self._syncing:
            self._cond.wait()
        if self._sealed is None:
            self._write_seal()
        assert self._sealed is not None  # noqa: S101 - _write_seal set it or raised
        index, last_seq, _ = self._sealed
        try:
            if self._index == index and self._fd >= 0:
                self._fs.sync(self._fd)
                self._durable_seq = last_seq
        except OSError as exc:
            raise self._poison(exc) from exc
        self._closed = self._unusable = True
        self._sealed = None
