"""`walj audit`: write the verifiable export of every session's executions, resolutions and
approvals (the rows, then the manifest), into a file that appears whole or not at all."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import time
from typing import Any

from .. import __version__
from ..log import format as fmt
from ..log.fs import DEFAULT_FS, write_all
from ._audit_args import iso_time, parse_time
from ._audit_rows import COLUMNS, SCHEMA, csv_header, csv_row, json_row, within
from ._audit_sources import Source, read_session, sources
from ._common import EXIT_OK, EXIT_PROBLEMS, CliError, json_text, plural, write_lines

MANIFEST_SUFFIX = ".manifest.json"  # beside a CSV export
_FLUSH_BYTES = 1 << 20


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """The manifest as one line of JSON: `{"manifest": {...}}`."""
    text = json.dumps({"manifest": manifest}, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False)
    return (json_text(text) + "\n").encode("utf-8")


class ExportFile:
    """The export under a temporary name beside FILE, the rows' SHA-256 taken over the bytes
    as written. `finish` adds the manifest, syncs each file, renames it into place and syncs
    the directory; until then FILE is untouched, and `discard` removes what was written."""

    def __init__(self, path: str, form: str) -> None:
        self.path = path
        self.form = form
        token = secrets.token_hex(4)
        self.temps = [f"{path}.tmp-{token}"]
        self.finals = [path]
        if form == "csv":
            self.temps.append(f"{path}{MANIFEST_SUFFIX}.tmp-{token}")
            self.finals.append(path + MANIFEST_SUFFIX)
        self.fd: int | None = None
        self.rows = 0
        self.digest = hashlib.sha256()
        self.pending = bytearray()
        self.renamed = 0  # how many of the temporary files are in place

    def open(self) -> None:
        self.fd = DEFAULT_FS.create(self.temps[0])
        if self.form == "csv":
            self._write(csv_header())

    def _write(self, data: bytes) -> None:
        self.digest.update(data)
        self.pending += data
        if len(self.pending) >= _FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.pending and self.fd is not None:
            write_all(DEFAULT_FS, self.fd, bytes(self.pending))
            self.pending.clear()

    def add(self, row: dict[str, Any]) -> None:
        self._write(json_row(row) if self.form == "jsonl" else csv_row(row))
        self.rows += 1

    def finish(self, manifest: dict[str, Any]) -> None:
        """Write the manifest (the last line, or the sidecar of a CSV), then make both durable
        under their own names: each file synced before its rename, the directory after."""
        assert self.fd is not None
        line = manifest_bytes(manifest)
        if self.form == "jsonl":
            self.pending += line
        self._flush()
        DEFAULT_FS.sync(self.fd)
        fd, self.fd = self.fd, None
        DEFAULT_FS.close(fd)
        if self.form == "csv":
            fd = DEFAULT_FS.create(self.temps[1])
            try:
                write_all(DEFAULT_FS, fd, line)
                DEFAULT_FS.sync(fd)
            finally:
                DEFAULT_FS.close(fd)
        self._rename_rest()
        DEFAULT_FS.sync_dir(os.path.dirname(os.path.abspath(self.path)))

    def _rename_rest(self) -> None:
        while self.renamed < len(self.temps):
            DEFAULT_FS.rename(self.temps[self.renamed], self.finals[self.renamed])
            self.renamed += 1

    def discard(self) -> None:
        """After an error or an interrupt: remove the temporary files and leave FILE as it was;
        once the first rename was made, make the rest (a CSV and its manifest go together)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            DEFAULT_FS.close(fd)
        if self.renamed:
            self._rename_rest()
            return
        for temp in self.temps:
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass


def cmd_audit(args: argparse.Namespace) -> int:
    if args.verify is not None:
        if args.output is not None or args.since is not None or args.until is not None:
            raise CliError("--verify takes the export and the logs only: its filters and "
                           "format are the ones its manifest names")
        from ._audit_verify import verify_export

        return verify_export(args.verify, args.target, args.archive, as_json=args.json)
    if args.output is None:
        raise CliError("audit needs -o FILE (or --verify FILE)")
    if args.json:
        raise CliError("--json goes with --verify (the export itself is JSON Lines or CSV)")
    since, until = parse_time(args.since, "--since"), parse_time(args.until, "--until")
    if since is not None and until is not None and since >= until:
        raise CliError("--since must come before --until")
    found = sources(args.target, args.archive)
    _check_output(args.output, found)
    export = ExportFile(args.output, args.format)
    try:
        export.open()
        entries = []
        for source in found:
            read = read_session(source)
            for row in read.rows.rows:
                if within(row, since, until):
                    export.add(row)
            entries.append(read.entry)
        manifest = {
            "schema": SCHEMA, "walj_version": __version__, "format": args.format,
            "columns": list(COLUMNS), "created_at": time.time(),
            "target": args.target, "archive": args.archive,
            "filters": {"since": since, "until": until, "since_time": iso_time(since),
                        "until_time": iso_time(until)},
            "sessions": entries, "rows": export.rows, "rows_sha256": export.digest.hexdigest(),
        }
        export.finish(manifest)
    finally:
        export.discard()
    return _summary(args.output, manifest)


def _check_output(path: str, found: list[Source]) -> None:
    """Refuse an output that would land among a log's own files."""
    if fmt.segment_index(os.path.basename(path)) is not None:
        raise CliError(f"{path}: an export is not named like a segment (seg-*.jsonl)")
    where = os.path.dirname(os.path.abspath(path))
    for source in found:
        if source.origin != "archive" and os.path.abspath(source.directory) == where:
            raise CliError(f"{path} is inside the session directory {source.directory}: "
                           "write the export elsewhere (read commands never write a log)")
    if os.path.isdir(path):
        raise CliError(f"{path} is a directory; -o takes the export's file name")


def _summary(path: str, manifest: dict[str, Any]) -> int:
    sessions = manifest["sessions"]
    unreadable = [e for e in sessions if e["state"] == "unreadable"]
    damaged = [e for e in sessions if e.get("problem_count")]
    where = f" (manifest: {path}{MANIFEST_SUFFIX})" if manifest["format"] == "csv" else ""
    lines = [f"{path}: {plural(manifest['rows'], 'row')} from "
             f"{plural(len(sessions), 'session')}{where}",
             f"  rows sha256 {manifest['rows_sha256']}"]
    lines += [f"  unreadable, not exported: {e['session']}: {e['detail']}" for e in unreadable]
    lines += [f"  damaged (what verifies is exported): {e['session']}: "
              f"{plural(e['problem_count'], 'problem')}; `walj verify` it" for e in damaged]
    write_lines(lines)
    return EXIT_PROBLEMS if unreadable or damaged else EXIT_OK
