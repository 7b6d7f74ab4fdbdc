"""`walj audit`'s sessions: which logs a ROOT, a PATH or an archive URL holds, and one read of
each (salvage mode, no lock): its rows and what the manifest says of it (segments, seals, the
chain's head, the active segment as far as it was read)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

from ..archive import ArchiveError, is_url
from ..errors import WaljError
from ..log.ends import read_ends
from ..log.fs import DEFAULT_FS, FileSystem
from ..log.scan import LogScan
from ._audit_rows import SessionRows
from ._common import CliError, problem_json, torn_json
from ._sweep import find_logs, relative

_HASH_CHUNK = 1 << 20
MAX_PROBLEMS = 20  # listed per session in the manifest (all are counted)


@dataclass
class Source:
    """One session to read: its name in the export, and the directory and file system a scan
    reads it through (a local directory, an archive view, or both)."""

    name: str
    directory: str
    fs: FileSystem
    origin: str  # "local", "archive" or "archive+local"
    unreadable: str | None = None  # why it cannot be read (a symbolic link, ...)


@dataclass
class SessionRead:
    """What one read of a session gave: its manifest entry and its rows."""

    entry: dict[str, Any]
    rows: SessionRows
    segments: dict[str, dict[str, Any]]  # by name: as in the entry
    problems: list[dict[str, Any]]  # every problem found


def sources(target: str, archive: str | None) -> list[Source]:
    """The sessions of `target` in name order: every log under a local directory (itself
    included), the one archived session a URL names, or every session under an archive root.
    With `archive`, each local session is read from there first, then from its directory."""
    if is_url(target):
        if archive is not None:
            raise CliError("--archive goes with a local ROOT or PATH; a URL is read alone")
        return _archived(target)
    if os.path.lexists(target) and not os.path.isdir(target):
        raise CliError(f"{target} is a file; audit takes a directory holding session logs, or "
                       "one session's directory")
    logs, unreadable = find_logs(target)
    found = [_local(path, target, archive) for path in logs]
    found += [Source(relative(e["path"], target), e["path"], DEFAULT_FS, "local",
                     unreadable=e["detail"] or "unreadable") for e in unreadable]
    if not found:
        raise CliError(f"{target} holds no walj log (no directory with seg-*.jsonl segments)")
    return sorted(found, key=lambda s: s.name)


def _archived(url: str) -> list[Source]:
    from ..archive._view import archived_sessions, open_view

    try:
        try:
            view = open_view(url)
            return [Source(".", view.directory, view, "archive")]
        except ArchiveError:  # no segment right there: an archive root
            urls = archived_sessions(url)
        found = []
        for session in urls:
            view = open_view(session)
            found.append(Source(relative(session, url), view.directory, view, "archive"))
    except (ArchiveError, ImportError) as exc:
        raise CliError(str(exc)) from None
    if not found:
        raise CliError(f"{url} holds no archived session (an archived session is "
                       "ARCHIVE/<log id>)")
    return found


def _local(path: str, root: str, archive: str | None) -> Source:
    name = relative(path, root)
    if archive is None:
        return Source(name, path, DEFAULT_FS, "local")
    from ..archive._store import open_store
    from ..archive._view import ArchiveView, local_log_id

    try:
        view = ArchiveView(open_store(archive), (local_log_id(path),), path, local=path)
        if not view.remote():  # nothing shipped yet: the directory alone is the session
            return Source(name, path, DEFAULT_FS, "local")
    except (ArchiveError, ImportError) as exc:
        raise CliError(str(exc)) from None
    return Source(name, path, view, "archive+local")


def read_session(source: Source, through: int | None = None) -> SessionRead:
    """Scan one session (every record that verifies; problems kept, never raised) into its
    rows (records after `through` not taken) and its manifest entry."""
    entry: dict[str, Any] = {"session": source.name, "origin": source.origin}
    if source.unreadable is not None:
        entry.update(state="unreadable", detail=source.unreadable)
        return SessionRead(entry, SessionRows(source.name, None), {}, [])
    log_scan = LogScan(source.directory, mode="salvage", fs=source.fs)
    rows = SessionRows(source.name, None, through)
    try:
        for seq, raw in log_scan:
            rows.add(seq, raw)
        finish = getattr(source.fs, "finish", None)
        if finish is not None:
            finish(log_scan)
        segments = _segments(log_scan, source)
    except (OSError, WaljError) as exc:
        entry.update(state="unreadable", detail=f"{source.directory}: {exc}")
        return SessionRead(entry, SessionRows(source.name, None), {}, [])
    rows.log_id = log_scan.log_id
    for row in rows.rows:
        row["log_id"] = log_scan.log_id
    problems = [problem_json(p) for p in log_scan.problems]
    base = log_scan.base
    sealed = [s for s in segments if s["state"] == "sealed"]
    entry.update(
        state="read", log_id=log_scan.log_id, records=log_scan.records,
        last_seq=log_scan.last_seq,
        base=None if base is None else {"segment": base.index, "first_seq": base.first_seq,
                                        "prev": base.prev_seal},
        segments=segments,
        chain_head=({"segment": sealed[-1]["segment"], "sha256": sealed[-1]["sha256"]}
                    if sealed else None),
        problem_count=len(problems), problems=problems[:MAX_PROBLEMS],
        torn_tail=torn_json(log_scan.torn_tail), undecodable=rows.undecodable)
    return SessionRead(entry, rows, {s["segment"]: s for s in segments}, problems)


def _segments(log_scan: LogScan, source: Source) -> list[dict[str, Any]]:
    """Each segment the scan read: a sealed one by its seal (which the scan checked against
    its bytes: a mismatch is among the problems); the last one, unsealed, by what was read of
    it (records, bytes and their SHA-256)."""
    out: list[dict[str, Any]] = []
    last = log_scan.last
    for name in log_scan.segments:
        if last is not None and name == last.name:
            header, seal = last.header, last.seal
        else:
            header, seal = read_ends(source.fs, source.directory, name)
        segment: dict[str, Any] = {"segment": name,
                                   "first_seq": None if header is None else header.first_seq}
        if seal is not None:
            segment.update(state="sealed", records=seal.records, last_seq=seal.last_seq,
                           sha256=seal.sha256)
        elif last is not None and name == last.name:
            segment.update(state="unsealed", records=last.records, last_seq=last.last_seq,
                           bytes=last.valid_end, sha256=last.digest.hexdigest())
        else:  # a segment before the last without a seal: a problem the scan reported
            segment.update(state="unsealed", records=None, last_seq=None, bytes=None,
                           sha256=None)
        out.append(segment)
    return out


def prefix_sha256(source: Source, name: str, length: int) -> str | None:
    """The SHA-256 of a segment's first `length` bytes as they are now; None when the segment
    is gone or shorter."""
    try:
        fd = source.fs.open_read(os.path.join(source.directory, name))
    except (OSError, WaljError):
        return None
    digest = hashlib.sha256()
    try:
        offset = 0
        while offset < length:
            chunk = source.fs.pread(fd, min(_HASH_CHUNK, length - offset), offset)
            if not chunk:
                return None
            digest.update(chunk)
            offset += len(chunk)
    finally:
        source.fs.close(fd)
    return digest.hexdigest()
