"""Shipping a session to an archive: copy, read back, verify; never delete, never write over
another history."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from ..errors import CorruptionError, WaljError
from ..log import format as fmt
from ..log.fs import DEFAULT_FS, open_regular
from ..log.scan import corruption, list_segments
from ..log.segment import read_ends
from ._append import ForkError, write_once
from ._quarantine import has_quarantine, ship_quarantine
from ._report import ShipReport
from ._store import Entry, Store, open_store
from ._view import local_log_id


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


def _what_differs(back: bytes, size: int, index: int, log_id: str) -> str:
    """What an archived object that is not the local segment (nor a copy of it) holds."""
    head = back.split(b"\n", 1)[0]
    try:
        header = fmt.parse_header(head) if fmt.checksum_ok(head) else None
    except WaljError:
        header = None
    if header is not None and header.log_id != log_id:
        return f"a segment of another log, {header.log_id}"
    if len(back) <= size and _check_bytes(back, fmt.segment_name(index), index, log_id,
                                          None) is None:
        return ("a verified sealed segment of another history of this log: a fork (the "
                "session directory was copied and both copies went on)")
    if header is not None and header.index == index and len(back) > size:
        return "a longer segment of this log and index: a fork"
    return "bytes that are neither a partial nor a damaged copy of it"


def _check_predecessor(store: Store, remote: dict[str, Entry], directory: str,
                       report: ShipReport, names: set[str], header: fmt.Header) -> None:
    """The first sealed local segment chains to the seal of the segment before it; when that
    one is only in the archive (compacted away here), its archived seal must be that seal,
    or the local session continues another history than the archive's."""
    index, url = header.index, report.url
    before = fmt.segment_name(index - 1) if index > 1 else None
    if before is None or before in names:
        return
    entry = remote.get(before)
    if entry is None or not entry.regular:
        return
    key = store.key(header.log_id, before)
    tail = store.read_range(key, max(0, entry.size - fmt.HEADER_LINE_LIMIT), entry.size)
    last = tail[tail.rfind(b"\n", 0, len(tail) - 1) + 1:-1]
    seal = fmt.parse_seal(last) if tail.endswith(b"\n") and fmt.checksum_ok(last) else None
    if seal is not None and seal.sha256 != header.prev_seal:
        local = os.path.join(directory, fmt.segment_name(index))
        raise ForkError(f"{local} continues a segment sealed {header.prev_seal[:16]}..., but "
                        f"{url}/{before} is sealed {seal.sha256[:16]}...: another history of "
                        "this log (a fork): refused, nothing shipped on top of it",
                        local=local, archived=f"{url}/{before}")


def _write_segment(store: Store, key: str, data: bytes, entry: Entry | None,
                   header: fmt.Header, local: str, archived: str) -> str:
    """write_once for a sealed segment: a damaged copy is one of the same length that ends
    with this segment's own seal line."""
    seal_line = data[data.rfind(b"\n", 0, len(data) - 1):]

    def damaged_copy(back: bytes) -> bool:
        return len(back) == len(data) and back.endswith(seal_line)

    def why(back: bytes) -> str:
        return _what_differs(back, len(data), header.index, header.log_id)

    def complete(back: bytes) -> bool:  # a verified sealed segment, of any log
        return _check_bytes(back, os.path.basename(key), header.index, None, None) is None

    return write_once(store, key, data, entry, local=local, archived=archived,
                      damaged_copy=damaged_copy, why=why, complete=complete)


def ship(path: str | os.PathLike[str], url: str | os.PathLike[str], *,
         storage_options: dict[str, Any] | None = None, recheck: bool = False) -> ShipReport:
    """Copy every sealed segment of the session at `path` not yet archived to URL/<log_id>/,
    under the same names, and read each copy back to verify it (header, seal, SHA-256); then
    its quarantine/ (the cut bytes and their manifest, see _quarantine).

    Append-only: an object already there with the right size, header line and seal line is
    skipped (`recheck=True` reads it back in full instead); a missing one is written, and a
    partial or damaged copy of the same segment written over. An object that holds anything
    else (above all a verified segment of another history: a fork) raises ForkError, naming
    both, and nothing after it is shipped. Never deletes, takes no lock, never reads the
    active segment, so it runs beside a live writer. A sealed local segment that does not
    verify raises CorruptionError before anything of it is copied; the ones before it stay
    shipped.
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
    remote: dict[str, Entry] = {}
    names = {name for _, name in listed}
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
            _check_predecessor(store, remote, directory, report, names, header)
        key = store.key(header.log_id, name)
        entry = remote.get(name)
        if not recheck and _object_matches(store, key, entry, head + b"\n",
                                           b"\n" + tail + b"\n", len(data)):
            report.skipped.append(name)
            continue
        outcome = _write_segment(store, key, data, entry, header,
                                 os.path.join(directory, name), f"{report.url}/{name}")
        report.count(outcome, name, len(data))
    if report.log_id is None and has_quarantine(directory):
        # Nothing sealed yet: the cuts still go under the log's id, from the first header.
        report.log_id = local_log_id(directory)
        report.url = f"{base}/{report.log_id}"
    ship_quarantine(store, directory, report)
    return report


def verified_copies(path: str | os.PathLike[str], url: str | os.PathLike[str],
                    storage_options: dict[str, Any] | None = None) -> set[str]:
    """Ship the session at `path`, reading back every archived copy in full (`recheck`), and
    return the names whose archived copy matches the local file byte for byte and verifies:
    the sealed segments compaction may delete locally, and `quarantine/<file>` (with
    `quarantine/MANIFEST.jsonl`) for the session's quarantined cuts. ForkError when the
    archive holds another history: then nothing may be dropped."""
    report = ship(path, url, storage_options=storage_options, recheck=True)
    return (set(report.shipped) | set(report.repaired) | set(report.skipped)) - set(
        report.unverified)
