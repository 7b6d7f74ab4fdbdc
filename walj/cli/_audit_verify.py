"""`walj audit --verify`: derive an export's rows again from the logs, with its manifest's
filters and through each session's exported last seq, and compare rows, seals, chain heads and
the session set; one finding per difference."""

from __future__ import annotations

import bisect
import csv
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ._audit_rows import COLUMNS, SCHEMA, csv_header, csv_row, json_row, within
from ._audit_sources import Source, prefix_sha256, read_session, sources
from ._common import EXIT_OK, EXIT_PROBLEMS, CliError, emit_json, plural, write_lines

VERIFY_SCHEMA = "walj.audit-verify/1"
MANIFEST_SUFFIX = ".manifest.json"
SHOWN_PER_KIND = 50  # findings listed per kind; all are counted

Key = tuple[str, int]  # (session, seq): a row's own record


@dataclass
class Findings:
    """What differs, as one-line findings, at most SHOWN_PER_KIND listed per kind."""

    listed: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, detail: str, session: str | None = None, seq: int | None = None,
            line: int | None = None) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] <= SHOWN_PER_KIND:
            self.listed.append({"kind": kind, "session": session, "seq": seq, "line": line,
                                "detail": detail})

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class Export:
    """An export as read back: its manifest, and each row's key and digest in file order."""

    manifest: dict[str, Any]
    rows: list[tuple[Key | None, str, int]]  # (key, SHA-256 of the row's bytes, line)
    rows_sha256: str
    header_ok: bool = True  # a CSV's first line is the header this walj writes


def verify_export(path: str, target: str, archive: str | None, *, as_json: bool) -> int:
    export = read_export(path)
    manifest = export.manifest
    findings = Findings()
    found = {s.name: s for s in sources(target, archive)}
    exported = {e["session"]: e for e in manifest["sessions"] if isinstance(e, dict)
                and isinstance(e.get("session"), str)}
    derived: list[tuple[Key, str]] = []
    filters = manifest["filters"]
    for name, entry in exported.items():
        source = found.get(name)
        if source is None:
            findings.add("session_missing", "exported, and not among the logs given", name)
            continue
        derived += _check_session(entry, source, filters, manifest["format"], findings)
    for name in sorted(set(found) - set(exported)):
        findings.add("session_added", "among the logs given, and not in the export", name)
    _compare_rows(export, derived, findings)
    return _report(path, export, findings, as_json)


# --- the export, read back ------------------------------------------------------------------


def read_export(path: str) -> Export:
    """The export's manifest and rows; CliError (exit 2) for what is no export at all."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    if lines and lines[-1] == b"":
        lines.pop()
    manifest = _manifest_of(lines[-1]) if lines else None
    if manifest is not None:
        rows = [line + b"\n" for line in lines[:-1]]
        form = "jsonl"
    else:
        manifest = _sidecar(path)
        rows = [line + b"\n" for line in lines]
        form = "csv"
    if manifest.get("schema") != SCHEMA or manifest.get("format") != form:
        raise CliError(f"{path}: an export of schema {str(manifest.get('schema'))[:40]!r} in "
                       f"format {str(manifest.get('format'))[:10]!r}; this walj verifies "
                       f"{SCHEMA} (jsonl, or csv with FILE{MANIFEST_SUFFIX})")
    _check_manifest(path, manifest)
    digest = hashlib.sha256()
    for line in rows:
        digest.update(line)
    first = 2 if form == "csv" else 1
    header_ok = form != "csv" or (bool(rows) and rows[0] == csv_header())
    keyed = [(_key(line, form), hashlib.sha256(line).hexdigest(), number)
             for number, line in enumerate(rows[first - 1:], start=first)]
    return Export(manifest, keyed, digest.hexdigest(), header_ok)


def _manifest_of(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if isinstance(value, dict) and list(value) == ["manifest"] and isinstance(
            value["manifest"], dict):
        return value["manifest"]
    return None


def _sidecar(path: str) -> dict[str, Any]:
    side = path + MANIFEST_SUFFIX
    try:
        with open(side, "rb") as f:
            manifest = _manifest_of(f.read().rstrip(b"\n"))
    except FileNotFoundError:
        raise CliError(f"{path} is no walj audit export: its last line is no manifest, and "
                       f"there is no {side}") from None
    except OSError as exc:
        raise CliError(f"{side}: {exc.strerror or exc}") from None
    if manifest is None:
        raise CliError(f"{side} holds no manifest ({{\"manifest\": ...}})")
    return manifest


def _check_manifest(path: str, manifest: dict[str, Any]) -> None:
    filters = manifest.get("filters")
    ok = (isinstance(manifest.get("sessions"), list) and isinstance(filters, dict)
          and all(_time_or_none(filters.get(k)) for k in ("since", "until"))
          and type(manifest.get("rows")) is int and isinstance(manifest.get("rows_sha256"), str))
    if not ok:
        raise CliError(f"{path}: the manifest lacks its sessions, filters, rows or rows_sha256")


def _time_or_none(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and value == value)


def _key(line: bytes, form: str) -> Key | None:
    """The row's (session, seq), if the line is a row at all."""
    try:
        if form == "jsonl":
            value = json.loads(line)
            session, seq = (value.get("session"), value.get("seq")) if isinstance(
                value, dict) else (None, None)
        else:
            cells = next(csv.reader([line.decode("utf-8").rstrip("\r\n")]))
            index = COLUMNS.index
            session, seq = cells[index("session")], int(cells[index("seq")])
            session = session[1:] if session.startswith("'") else session
    except (ValueError, IndexError, StopIteration, UnicodeDecodeError, RecursionError):
        return None
    return (session, seq) if isinstance(session, str) and type(seq) is int else None


# --- the logs -------------------------------------------------------------------------------


def _check_session(entry: dict[str, Any], source: Source, filters: dict[str, Any], form: str,
                   findings: Findings) -> list[tuple[Key, str]]:
    """Read the session again through the exported last seq: its rows (as keys and digests),
    and a finding for each way its log differs from the one exported."""
    name = source.name
    through = entry.get("last_seq") if type(entry.get("last_seq")) is int else 0
    read = read_session(source, through)
    now = read.entry
    if entry.get("state") != now["state"]:
        findings.add("session_differs", f"{entry.get('state')} when exported, "
                     f"{now['state']} now", name)
        return []
    if now["state"] == "unreadable":
        return []
    if entry.get("log_id") != now["log_id"]:
        findings.add("log_id_differs", f"log id {entry.get('log_id')} exported, "
                     f"{now['log_id']} now", name)
    if now["last_seq"] < through:
        findings.add("records_missing", f"the export read through seq {through}; the log "
                     f"now ends at seq {now['last_seq']}", name)
    _check_segments(entry, source, read.segments, findings)
    _check_problems(entry, read.problems, findings, name)
    encode = json_row if form == "jsonl" else csv_row
    since, until = filters.get("since"), filters.get("until")
    derived = []
    for row in read.rows.rows:
        if within(row, since, until):
            line = encode(row)  # keyed as a row read back from the file is keyed
            derived.append((_key(line, form) or (name, row["seq"]),
                            hashlib.sha256(line).hexdigest()))
    return derived


def listed(value: Any) -> list[dict[str, Any]]:
    """The objects of a manifest's list (an edited manifest may hold anything there)."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _check_segments(entry: dict[str, Any], source: Source, now: dict[str, dict[str, Any]],
                    findings: Findings) -> None:
    """Each exported segment as it is now: a sealed one with the same seal, the one that was
    active with the same bytes as far as they were read (it may have grown or been sealed)."""
    name = source.name
    head = entry.get("chain_head")
    head_name = head.get("segment") if isinstance(head, dict) else None
    for segment in listed(entry.get("segments")):
        seg_name = segment.get("segment")
        current = now.get(seg_name) if isinstance(seg_name, str) else None
        if current is None or not isinstance(seg_name, str):
            findings.add("segment_missing", f"{seg_name} was exported and is not in the log",
                         name)
        elif segment.get("state") == "sealed":
            if (current["state"], current["sha256"], current["records"]) != (
                    "sealed", segment.get("sha256"), segment.get("records")):
                kind = "chain_head_differs" if head_name == seg_name else \
                    "seal_differs"
                findings.add(kind, f"{seg_name}: sealed with sha256 {segment.get('sha256')} "
                             f"when exported; now {current['state']}, "
                             f"sha256 {current['sha256']}", name)
        elif type(segment.get("bytes")) is int and segment.get("sha256") is not None:
            if prefix_sha256(source, seg_name, segment["bytes"]) != segment["sha256"]:
                findings.add("unsealed_differs", f"{seg_name}: its first {segment['bytes']} "
                             "bytes (what the export read of the active segment) changed",
                             name)


def _check_problems(entry: dict[str, Any], problems: list[dict[str, Any]], findings: Findings,
                    name: str) -> None:
    """Damage in what the export covered that the export did not record: a sealed segment
    edited since (its seal no longer matches), or the unsealed part rewritten."""
    covered = {s.get("segment"): s for s in listed(entry.get("segments"))}
    known = {(p.get("file"), p.get("offset"), p.get("kind"))
             for p in listed(entry.get("problems"))}
    listed_all = entry.get("problem_count") == len(known)
    for problem in problems:
        segment = covered.get(problem["file"])
        if segment is None or (segment.get("state") != "sealed"
                               and problem["offset"] >= (segment.get("bytes") or 0)):
            continue  # after what was exported
        if (problem["file"], problem["offset"], problem["kind"]) in known or not listed_all:
            continue
        findings.add("damage", f"{problem['file']} at byte {problem['offset']:,}: "
                     f"{problem['kind']}, not there when exported", name, problem["seq"])


# --- the rows -------------------------------------------------------------------------------


def _compare_rows(export: Export, derived: list[tuple[Key, str]], findings: Findings) -> None:
    manifest = export.manifest
    rows = export.rows
    if not export.header_ok:
        findings.add("row_edited", "the CSV header line differs from the columns", line=1)
    if export.rows_sha256 != manifest["rows_sha256"]:
        findings.add("rows_digest", f"the rows' SHA-256 is {export.rows_sha256}; the manifest "
                     f"says {manifest['rows_sha256']}")
    if len(rows) != manifest["rows"]:
        findings.add("rows_count", f"{len(rows)} rows; the manifest says {manifest['rows']}")
    expected = {key: (digest, i) for i, (key, digest) in enumerate(derived)}
    seen: set[Key] = set()
    order: list[tuple[int, Key, int]] = []  # (derived position, key, line) in file order
    for key, digest, line in rows:
        if key is None or key in seen or key not in expected:
            what = "not a row" if key is None else "a second copy of a row" if key in seen \
                else "no such row in the logs"
            session, seq = key if key is not None else (None, None)
            findings.add("row_added", what, session, seq, line)
            continue
        seen.add(key)
        if digest != expected[key][0]:
            findings.add("row_edited", "differs from the row the logs give", *key, line=line)
        order.append((expected[key][1], key, line))
    for key, _ in derived:
        if key not in seen:
            findings.add("row_missing", "the logs give this row; the export lacks it", *key)
    for _, key, line in _moved(order):
        findings.add("row_moved", "out of the logs' order", *key, line=line)


def _moved(order: list[tuple[int, Key, int]]) -> Iterator[tuple[int, Key, int]]:
    """The rows outside a longest run in the logs' order: the fewest that moved."""
    tails: list[int] = []  # the smallest last position of a run of each length
    ends: list[int] = []  # index in `order` of that run's last row
    back = [-1] * len(order)
    for i, (position, _, _) in enumerate(order):
        at = bisect.bisect_left(tails, position)
        back[i] = ends[at - 1] if at else -1
        if at == len(tails):
            tails.append(position)
            ends.append(i)
        else:
            tails[at], ends[at] = position, i
    kept: set[int] = set()
    i = ends[-1] if ends else -1
    while i >= 0:
        kept.add(i)
        i = back[i]
    return (item for i, item in enumerate(order) if i not in kept)


def _report(path: str, export: Export, findings: Findings, as_json: bool) -> int:
    ok = findings.total == 0
    if as_json:
        emit_json({"schema": VERIFY_SCHEMA, "file": path, "ok": ok,
                   "rows": export.manifest["rows"],
                   "sessions": len(export.manifest["sessions"]), "counts": findings.counts,
                   "findings": findings.listed})
    else:
        lines = [f"{path}: {'matches the logs' if ok else 'DOES NOT MATCH the logs'}: "
                 f"{plural(export.manifest['rows'], 'row')} from "
                 f"{plural(len(export.manifest['sessions']), 'session')}"]
        for f in findings.listed:
            where = " ".join(part for part in (
                f"line {f['line']}" if f["line"] is not None else "",
                f"session {f['session']}" if f["session"] is not None else "",
                f"seq {f['seq']}" if f["seq"] is not None else "") if part)
            lines.append(f"{f['kind']}: {where + ': ' if where else ''}{f['detail']}")
        for kind, count in sorted(findings.counts.items()):
            if count > SHOWN_PER_KIND:
                lines.append(f"{kind}: {count - SHOWN_PER_KIND:,} more not listed")
        write_lines(lines)
    return EXIT_OK if ok else EXIT_PROBLEMS


