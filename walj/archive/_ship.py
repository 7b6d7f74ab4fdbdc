"""Shipping a session's sealed segments to an archive: copy, read back, verify; never delete."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import CorruptionError, WaljError
from ..log import _format as fmt
from ..log._fs import DEFAULT_FS, open_regular
from ..log._scan import corruption, list_segments
from ..log._segment import read_ends
from ._store import ArchiveError, Entry, Store, open_store

CHUNK = 1 << 20


@dataclass
class ShipReport:
    """What one `ship` did. `shipped` were copied and read back intact (`replaced`: of them,
    those whose object was there but wrong: partial, edited or foreign); `skipped` were
    already archived; `bytes` is what was copied."""

    log_id: str | None
    url: str
    shipped: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"schema": "walj.archive/1", "log_id": self.log_id, "url": self.url,
                "shipped": list(self.shipped), "replaced": list(self.replaced),
                "skipped": list(self.skipped), "bytes": self.bytes}


def _ends(data: bytes) -> tuple[bytes, bytes]:
    """A sealed segment's first line (the header) and last line (the seal), without newlines."""
    first = data.split(b"\n", 1)[0]
    last_start = data.rfind(b"\n", 0, len(data) - 1) + 1
    return first, data[last_start:-1]


def _sealed_bytes(path: str, name: str, index: int, log_id: str | None) -> bytes | None:
    """The whole segment, if it is sealed and verifies as a sealed segment must: a verified
    header (this log, this index) and a verified seal whose SHA-256 matches the bytes before
    it. None: not sealed (the active segment). A sealed segment that does not verify raises
    CorruptionError, and is never shipped."""
    header, seal = read_ends(DEFAULT_FS, path, name)
    if seal is None:
        return None
    # Never through a symlink or into a FIFO swapped in since the listing: as the log opens.
    with os.fdopen(open_regular(os.path.join(path, name), os.O_RDONLY), "rb") as f:
        data = f.read()
    problem = _check_bytes(data, name, index, log_id, seal.sha256)
    if header is None or problem is not None:
        # The kind `walj verify` gives the same damage.
        kind = ("foreign_segment" if header is not None and log_id is not None
                and header.log_id != log_id else "bad_header" if header is None
                or header.index != index else "seal_mismatch")
        raise CorruptionError(f"{path}/{name}: {problem or 'no verified header'}: not shipped "
                              "(`walj verify` the session)", file=name, offset=0, kind=kind)
    return data


def _check_bytes(data: bytes, name: str, index: int, log_id: str | None,
                 sha256: str | None) -> str | None:
    """Why `data` is not the sealed segment `name` of `log_id` (None: it is): header line and
    seal line verified, header naming the log and the index, the seal's SHA-256 matching every
    byte before the seal line, and, when given, the digest expected."""
    if not data.endswith(b"\n"):
        return "does not end with a whole line"
    head, tail = _ends(data)
    if not fmt.checksum_ok(head) or not fmt.checksum_ok(tail):
        return "header or seal line does not verify"
    try:
        header = fmt.parse_header(head)
    except WaljError:
        header = None
    seal = fmt.parse_seal(tail)
    if header is None or seal is None:
        return "no header or no seal"
    if header.index != index or (log_id is not None and header.log_id != log_id):
        return f"header names log {header.log_id} segment {header.index}"
    digest = hashlib.sha256(memoryview(data)[: len(data) - len(tail) - 1]).hexdigest()
    if digest != seal.sha256:
        return "bytes do not match the SHA-256 in the seal"
    if sha256 is not None and seal.sha256 != sha256:
        return "seal differs from the session's"
    return None


def _object_matches(store: Store, key: str, entry: Entry | None, data_head: bytes,
                    data_tail: bytes, size: int) -> bool:
    """The cheap check that an object is already this segment: same size, same header line and
    same seal line (whose SHA-256 names every byte before it). A bit flipped inside an object
    of the right size is left to `walj verify URL` (or ship(recheck=True))."""
    if entry is None or not entry.regular or entry.size != size:
        return False
    head = store.read_range(key, 0, min(size, len(data_head)))
    tail = store.read_range(key, max(0, size - len(data_tail)), size)
    return head == data_head and tail == data_tail


def _read_back(store: Store, key: str, size: int) -> bytes:
    """The object as stored, read in chunks and never past one byte more than the expected
    size: an object that grew is wrong without being read whole."""
    parts: list[bytes] = []
    got = 0
    with store.open_read(key) as f:
        while got <= size:
            part = f.read(min(CHUNK, size + 1 - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
    return b"".join(parts)


def ship(path: str | os.PathLike[str], url: str | os.PathLike[str], *,
         storage_options: dict[str, Any] | None = None, recheck: bool = False) -> ShipReport:
    """Copy every sealed segment of the session at `path` not yet archived to URL/<log_id>/,
    under the same names, and read each copy back to verify it (header, seal, SHA-256).

    Idempotent and resumable: an object already there with the right size, header line and
    seal line is skipped (`recheck=True` reads it back in full instead); a missing, partial or
    wrong one is written again. Never deletes, takes no lock, never reads the active segment,
    so it runs beside a live writer. A sealed local segment that does not verify raises
    CorruptionError before anything of it is copied; the ones before it stay shipped.
    """
    directory = os.fspath(path)
    if not os.path.isdir(directory):
        raise WaljError(f"{directory} is not a directory (a session is a directory of segments)")
    listed, refused = list_segments(DEFAULT_FS, directory)
    if refused:
        raise corruption(refused[0])
    store = open_store(url, storage_options)
    base = os.fspath(url).rstrip("/")
    report = ShipReport(None, base)
    remote: dict[str, Entry] | None = None
    for index, name in listed:
        try:
            data = _sealed_bytes(directory, name, index, report.log_id)
        except FileNotFoundError:
            continue  # removed since the listing: compaction ships before it drops
        if data is None:
            break  # the active segment: nothing after it is sealed
        head, tail = _ends(data)
        header = fmt.parse_header(head)
        assert header is not None  # _sealed_bytes verified it
        if report.log_id is None:
            report.log_id = header.log_id
            report.url = f"{base}/{header.log_id}"
            remote = store.list(store.key(header.log_id))
        assert remote is not None
        key = store.key(header.log_id, name)
        entry = remote.get(name)
        if entry is not None and not entry.regular:
            raise ArchiveError(f"{report.url}/{name} is a prefix or directory, not an object: "
                               "refusing to write over it")
        if not recheck and _object_matches(store, key, entry, head + b"\n",
                                           b"\n" + tail + b"\n", len(data)):
            report.skipped.append(name)
            continue
        if recheck and entry is not None and entry.size == len(data):
            back = _read_back(store, key, len(data))
            if back == data:
                report.skipped.append(name)
                continue
        store.put(key, data)
        back = _read_back(store, key, len(data))
        seal = fmt.parse_seal(tail)
        problem = (_check_bytes(back, name, index, header.log_id, seal.sha256 if seal else None)
                   if len(back) == len(data) else f"{len(back)} bytes read back, not {len(data)}")
        if problem is None and back != data:
            problem = "read back differs from the session's segment"
        if problem is not None:
            raise ArchiveError(f"{report.url}/{name}: the copy does not read back intact: "
                               f"{problem}")
        report.shipped.append(name)
        if entry is not None:
            report.replaced.append(name)
        report.bytes += len(data)
    return report



def verified_copies(path: str | os.PathLike[str], url: str | os.PathLike[str],
                    storage_options: dict[str, Any] | None = None) -> set[str]:
    """Ship the session at `path`, reading back every archived copy in full (`recheck`), and
    return the names of the sealed segments whose copy matches the local file byte for byte:
    the ones compaction may delete locally."""
    report = ship(path, url, storage_options=storage_options, recheck=True)
    return set(report.shipped) | set(report.skipped)
