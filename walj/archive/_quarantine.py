"""A session's quarantine/ in the archive: shipping the cut bytes and their manifest, and
checking the archived copy against the manifest.

Layout: ARCHIVE/<log id>/quarantine/<file> holds each cut file byte for byte, written once;
the manifest, which only ever grows, is stored as versions named by their length,
quarantine/MANIFEST.<bytes>.jsonl, each a prefix of the next. A version is never written
over: a longer local manifest is a new object, and an archived version that is not a prefix
of the local manifest is another history (ForkError). The manifest goes last, so every
version names only cut files already archived and read back.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ..log.format import MANIFEST, QUARANTINE_DIR
from ..log.fs import DEFAULT_FS, open_regular
from ..log.quarantine import (
    MANIFEST_LIMIT,
    Quarantined,
    check_quarantine_dir,
    manifest_entries,
    plain_name,
)
from ..log.segment import Problem
from ._append import ForkError, read_back, read_chunks, write_once
from ._report import ShipReport
from ._store import Entry, Store

_VERSION = re.compile(r"^MANIFEST\.([0-9]{1,18})\.jsonl$")
MANIFEST_NAME = f"{QUARANTINE_DIR}/{MANIFEST}"


def version_name(length: int) -> str:
    return f"MANIFEST.{length}.jsonl"


def _versions(remote: dict[str, Entry]) -> list[tuple[int, str, Entry]]:
    """The archived manifest versions, shortest first."""
    found = []
    for name, entry in remote.items():
        match = _VERSION.match(name)
        if match is not None:
            found.append((int(match.group(1)), name, entry))
    return sorted(found)


def _read_local(path: str) -> bytes | None:
    """A local quarantine file whole (refused unless a regular file); None if it is gone."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _local_quarantine(directory: str) -> str | None:
    """The session's quarantine folder, None when it has none; one that is a symbolic link or
    no folder is refused, as a writer refuses it: its cut bytes would not be archived."""
    qdir = os.path.join(directory, QUARANTINE_DIR)
    if not os.path.lexists(qdir):
        return None
    check_quarantine_dir(DEFAULT_FS, qdir, why="its cut bytes cannot be archived")
    return qdir


def has_quarantine(directory: str) -> bool:
    return os.path.lexists(os.path.join(directory, QUARANTINE_DIR))


def ship_quarantine(store: Store, directory: str, report: ShipReport) -> None:
    """Ship the session's quarantine/ after its segments: the archived manifest is checked
    first (a prefix of the local one, or ForkError before anything is written), then each cut
    file, then the local manifest as a new version when it grew."""
    qdir = _local_quarantine(directory)
    if qdir is None:
        return
    if report.log_id is None:
        return  # no log id to file them under (ship sets it from a header when it can)
    prefix = store.key(report.log_id, QUARANTINE_DIR)
    url = f"{report.url}/{QUARANTINE_DIR}"
    remote = store.list(prefix)
    local_manifest = _read_local(os.path.join(qdir, MANIFEST))
    manifest = local_manifest or b""
    archived = _check_versions(store, prefix, url, qdir, remote, manifest, report)
    listed = {e.file: e for e in manifest_entries(manifest)}
    vouched = {e.file for e in manifest_entries(archived)}
    for name in sorted(os.listdir(qdir)):
        if name == MANIFEST or not plain_name(name) or _VERSION.match(name):
            continue
        data = _read_local(os.path.join(qdir, name))
        if data is not None:
            _ship_cut(store, prefix, url, qdir, name, data, listed.get(name),
                      remote.get(name), name in vouched, report)
    if local_manifest is None:
        return
    if manifest == archived:  # an empty one (a crash before its first line) holds nothing
        report.skipped.append(MANIFEST_NAME)
        return
    name = version_name(len(manifest))
    outcome = write_once(store, f"{prefix}/{name}", manifest, remote.get(name),
                         local=os.path.join(qdir, MANIFEST), archived=f"{url}/{name}",
                         damaged_copy=lambda back: False,
                         why=lambda back: "another manifest of the same length: a fork")
    report.count(outcome, MANIFEST_NAME, len(manifest))


def _check_versions(store: Store, prefix: str, url: str, qdir: str,
                    remote: dict[str, Entry], manifest: bytes, report: ShipReport) -> bytes:
    """The longest archived manifest, after checking that every version is a prefix of the
    local manifest (ForkError otherwise). A version cut short (a crashed ship on a store
    without atomic writes) is written again whole from the local manifest."""
    archived = b""
    local = os.path.join(qdir, MANIFEST)
    for length, name, entry in _versions(remote):
        back = read_back(store, f"{prefix}/{name}", length) if length <= len(manifest) else b""
        if length > len(manifest) or len(back) > length or not manifest.startswith(back):
            raise ForkError(f"{url}/{name} is not a prefix of {local}: the archive holds "
                            "another history of this session's quarantine (a fork); refused, "
                            "nothing written over it (docs/ARCHIVE.md, Forks)",
                            local=local, archived=f"{url}/{name}")
        if len(back) < length:
            write_once(store, f"{prefix}/{name}", manifest[:length], entry, local=local,
                       archived=f"{url}/{name}", damaged_copy=lambda back: False,
                       why=lambda back: "not a prefix of the local manifest")
            report.repaired.append(MANIFEST_NAME)
        archived = manifest[:length]
    return archived


def _ship_cut(store: Store, prefix: str, url: str, qdir: str, name: str, data: bytes,
              line: Quarantined | None, entry: Entry | None, vouched: bool,
              report: ShipReport) -> None:
    """One cut file. Its manifest line's SHA-256 and length say what it must hold: a local
    file that matches them is the cut, and an archived copy that the archived manifest lists
    but that differs is damage, written over (repaired). A local file that does not match its
    line is shipped as it is but counted `unverified`, unless the archive already holds the
    bytes the line names (then the archived copy is the cut, and stays)."""
    rel = f"{QUARANTINE_DIR}/{name}"
    key = f"{prefix}/{name}"
    intact = line is not None and _matches(data, line)
    if line is not None and not intact:
        if entry is not None and entry.regular and object_matches(store, key, line):
            report.skipped.append(rel)
            return
        report.unverified.append(rel)
    outcome = write_once(store, key, data, entry, local=os.path.join(qdir, name),
                         archived=f"{url}/{name}", damaged_copy=lambda back: intact and vouched,
                         why=lambda back: "another cut of the same name")
    report.count(outcome, rel, len(data))


def _matches(data: bytes, line: Quarantined) -> bool:
    return len(data) == line.length and hashlib.sha256(data).hexdigest() == line.sha256


def object_matches(store: Store, key: str, line: Quarantined) -> bool:
    """Whether the object holds exactly the bytes the manifest line names (length, SHA-256),
    read in chunks and never past one byte more than that length."""
    digest = hashlib.sha256()
    got = 0
    for part in read_chunks(store, key, line.length):
        digest.update(part)
        got += len(part)
    return got == line.length and digest.hexdigest() == line.sha256


@dataclass
class ArchivedQuarantine:
    """What `walj verify URL` and `walj sweep URL` show of an archived quarantine: the cuts
    its manifest records (each with whether its archived copy verifies), and the problems."""

    cuts: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(c["length"] for c in self.cuts)

    def summary(self) -> dict[str, Any]:
        return {"cuts": len(self.cuts), "bytes": self.bytes,
                "unverified": sum(1 for c in self.cuts if not c["verified"])}


def _problem(name: str, kind: str, detail: str) -> Problem:
    return Problem(f"{QUARANTINE_DIR}/{name}", 0, None, kind, detail)


def check_quarantine(store: Store, prefix: str) -> ArchivedQuarantine:
    """Read an archived session's quarantine/ (under `prefix`) as untrusted input: each
    manifest version whole and a prefix of the longest, and each cut the longest records
    present with the length and SHA-256 its line gives."""
    found = ArchivedQuarantine()
    remote = store.list(f"{prefix}/{QUARANTINE_DIR}")
    manifest = _check_archived_versions(store, f"{prefix}/{QUARANTINE_DIR}", remote, found)
    for line in manifest_entries(manifest):
        entry = remote.get(line.file)
        key = f"{prefix}/{QUARANTINE_DIR}/{line.file}"
        if entry is None:
            found.problems.append(_problem(line.file, "quarantine_missing", "a cut the "
                                           "archived manifest records has no archived copy"))
            verified = False
        elif not entry.regular:
            found.problems.append(_problem(line.file, "not_a_regular_file", "a prefix or "
                                           "directory named like a cut file: refused"))
            verified = False
        else:
            verified = object_matches(store, key, line)
            if not verified:
                found.problems.append(_problem(
                    line.file, "quarantine_mismatch", f"the archived copy is not the "
                    f"{line.length:,} bytes whose SHA-256 the manifest records"))
        found.cuts.append({"file": line.file, "segment": line.segment, "offset": line.offset,
                           "length": line.length, "kind": line.kind,
                           "time": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(line.time))
                           if 0 <= line.time < 1e11 else None, "verified": verified})
    return found


def _check_archived_versions(store: Store, prefix: str, remote: dict[str, Entry],
                             found: ArchivedQuarantine) -> bytes:
    """The longest whole manifest version; a version cut short, longer than walj writes,
    or not a prefix of the longest is a problem (kind quarantine_manifest)."""
    whole: list[tuple[str, bytes]] = []
    for length, name, entry in _versions(remote):
        if length > MANIFEST_LIMIT or not entry.regular:
            found.problems.append(_problem(name, "quarantine_manifest", "not a manifest walj "
                                           "writes (too long, or not a plain object)"))
            continue
        back = read_back(store, f"{prefix}/{name}", length)
        if len(back) != length:
            found.problems.append(_problem(name, "quarantine_manifest", f"{len(back):,} bytes, "
                                           f"not the {length:,} its name says: a partial "
                                           "copy (the next ship writes it again)"))
            continue
        whole.append((name, back))
    if not whole:
        return b""
    longest = whole[-1][1]
    for name, data in whole[:-1]:
        if not longest.startswith(data):
            found.problems.append(_problem(name, "quarantine_manifest", "not a prefix of the "
                                           f"longest version {whole[-1][0]}: two histories "
                                           "of this quarantine (a fork)"))
    return longest
