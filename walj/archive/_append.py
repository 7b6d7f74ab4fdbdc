"""The archive's append-only rule: write a local file's bytes to its object, never over bytes
that the object holds and the file does not.

An object that exists is one of: the same bytes (skipped); a copy of this very file that is
partial or damaged, so the file holds every byte it should hold (repaired: written over,
nothing lost); or anything else, above all a verified copy of another history of the same
name (a session copied, both copies gone on). The last is a ForkError and is never written
over: the local bytes may be the fork, and the archived ones may be the only copy left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ._store import ArchiveError, Entry, Store

CHUNK = 1 << 20

SHIPPED, REPAIRED, SKIPPED = "shipped", "repaired", "skipped"


class ForkError(ArchiveError):
    """The local file and the archived object of the same name hold different bytes, and
    the archived ones may be the only copy of records: a verified segment of another history
    of this log (the session directory was copied and both copies went on), another log's
    segment, or an object that is neither a partial nor a damaged copy of the local file.
    `local` and `archived` name both; nothing was written over the archived object, and a
    caller that drops local data after a ship (compaction, prune) drops nothing."""

    def __init__(self, message: str, *, local: str, archived: str) -> None:
        super().__init__(message)
        self.local = local
        self.archived = archived


def read_chunks(store: Store, key: str, size: int) -> Iterator[bytes]:
    """The object as stored, in chunks, never past one byte more than `size`: an object that
    grew is wrong without being read whole."""
    got = 0
    with store.open_read(key) as f:
        while got <= size and (part := f.read(min(CHUNK, size + 1 - got))):
            yield part
            got += len(part)


def read_back(store: Store, key: str, size: int) -> bytes:
    return b"".join(read_chunks(store, key, size))


# Whether an object's bytes (as read: at most one more than the file's) are a damaged copy
# of the local file: for a segment, the same length and the file's own seal line, whose
# SHA-256 names every byte before it.
DamagedCopy = Callable[[bytes], bool]


def write_once(store: Store, key: str, data: bytes, entry: Entry | None, *, local: str,
               archived: str, damaged_copy: DamagedCopy, why: Callable[[bytes], str],
               complete: Callable[[bytes], bool] = lambda back: False) -> str:
    """Make the object at `key` hold `data` without losing a byte the object held. Returns
    SHIPPED (a new object), REPAIRED (written over a partial or damaged copy of `data`) or
    SKIPPED (it held `data`). ForkError when it holds anything else (`why` says what, for
    the message), and always when it is `complete` in itself (a verified sealed segment),
    even one whose bytes begin the local file's; ArchiveError when what was written does not
    read back as `data`."""
    if entry is not None and not entry.regular:
        raise ArchiveError(f"{archived} is a prefix or directory, not an object: refusing to "
                           "write over it")
    if entry is None:
        if store.put_new(key, data):
            _check_back(store, key, data, archived)
            return SHIPPED
        # Otherwise another ship made it since the listing: judged as if it had been listed.
    back = read_back(store, key, len(data))
    if back == data:
        return SKIPPED
    if complete(back) or not (data.startswith(back) or damaged_copy(back)):
        raise ForkError(f"{archived} holds other bytes than {local} ({why(back)}): refused, "
                        "the archive is append-only; nothing was written over it or dropped "
                        "locally (docs/ARCHIVE.md, Forks)", local=local, archived=archived)
    store.put(key, data)
    _check_back(store, key, data, archived)
    return REPAIRED


def _check_back(store: Store, key: str, data: bytes, archived: str) -> None:
    back = read_back(store, key, len(data))
    if back != data:
        problem = (f"{len(back)} bytes read back, not {len(data)}" if len(back) != len(data)
                   else "read back differs from the local file")
        raise ArchiveError(f"{archived}: the copy does not read back intact: {problem}")
