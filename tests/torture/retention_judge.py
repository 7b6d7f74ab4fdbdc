"""The retention torture family's oracle: what a tree holds before a retention step, and the
checks after it. Retention and archival may remove only bytes they have accounted for.

Ground truth, gathered before every step and kept across the trial: every record of every
session found under ROOT or outside it (log id, seq, digest of its data), every file under a
`quarantine/` folder and every unknown file (digest of its bytes), every blocker of every
blocked session, and every file (inode and bytes) of a session a live writer holds and of the
sessions outside ROOT. After the step: every record is in a session on disk or in an archive
object that verifies on its own (header, every line's XXH64, seal, SHA-256), and each archived
session verifies as one seal chain; every quarantined or unknown byte is in a file on disk or an
archive object; every blocker still blocks where it was; nothing held or outside was touched.

Objects are read straight from the store (a directory, or the S3 API) and checked here, from
docs/FORMAT.md, not with the archive code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash
from budget import TALLY

import walj
from walj.archive import verify as verify_archived
from walj.cli._sweep import TOMBSTONE_PREFIX, check_log

PREFIX = b'{"xxh64":"'
BODY_START = len(PREFIX) + 16 + 2
RecordKey = tuple[str, int, str]  # log id, seq, SHA-256 of the record's data (canonical JSON)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_key(log_id: str, seq: int, data: Any) -> RecordKey:
    return log_id, seq, _digest(json.dumps(data, sort_keys=True).encode())


def _line(raw: bytes) -> dict[str, Any] | None:
    """A line whose XXH64 verifies, parsed; None otherwise."""
    if not raw.startswith(PREFIX) or raw[BODY_START - 2:BODY_START] != b'",':
        return None
    if xxhash.xxh64(raw[BODY_START:]).hexdigest().encode() != raw[len(PREFIX):BODY_START - 2]:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def sealed_object_records(log_id: str, name: str, data: bytes) -> list[RecordKey] | None:
    """The records of an archived segment that verifies on its own: every line's checksum, a
    header naming this log and this index, a seal whose SHA-256 is that of every byte before
    it and whose counts match. None: the object is not a verified copy of that segment."""
    if not data.endswith(b"\n") or not name.startswith("seg-") or not name.endswith(".jsonl"):
        return None
    lines = data[:-1].split(b"\n")
    parsed = [_line(raw) for raw in lines]
    if len(parsed) < 2 or any(value is None for value in parsed):
        return None
    header, *body, seal = parsed
    assert header is not None and seal is not None
    head, end = header.get("header"), seal.get("seal")
    if not isinstance(head, dict) or not isinstance(end, dict):
        return None
    if head.get("log") != log_id or f"seg-{head.get('seg', 0):010d}.jsonl" != name:
        return None
    if end.get("sha256") != _digest(data[:len(data) - len(lines[-1]) - 1]):
        return None
    keys = [record_key(log_id, v["seq"], v["data"]) for v in body if v and "seq" in v]
    if len(keys) != len(body) or end.get("records") != len(keys):
        return None
    return keys


class Store:
    """Every object under an archive root, read straight from where it is stored."""

    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.url = url
        self.env = env

    def objects(self) -> dict[str, bytes]:
        if self.url.startswith("file://"):
            root = Path(self.url.removeprefix("file://"))
            if not root.exists():
                return {}
            return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                    if p.is_file() and not p.is_symlink()}
        import boto3

        bucket, _, prefix = self.url.removeprefix("s3://").partition("/")
        client = boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL_S3"],
                              region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing")
        out: dict[str, bytes] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=prefix + "/"):
            for item in page.get("Contents", []):
                body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                out[item["Key"][len(prefix) + 1:]] = body
        return out


def _walk(top: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    """Like os.walk, links not followed, tombstones (what an interrupted prune left) skipped."""
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if not d.startswith(TOMBSTONE_PREFIX)]
        yield Path(dirpath), dirnames, filenames


def _segments(filenames: list[str]) -> list[str]:
    return sorted(n for n in filenames if n.startswith("seg-") and n.endswith(".jsonl"))


def _log_id(path: Path, segments: list[str]) -> str | None:
    for name in segments:
        with open(path / name, "rb") as f:
            value = _line(f.readline().rstrip(b"\n"))
        header = value.get("header") if value else None
        if isinstance(header, dict) and isinstance(header.get("log"), str):
            return header["log"]
    return None


@dataclass
class Disk:
    """What is on disk now under the tree's two folders."""

    sessions: dict[Path, str | None] = field(default_factory=dict)  # session dir -> log id
    records: dict[RecordKey, Path] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)  # digests of every regular file
    quarantined: dict[str, Path] = field(default_factory=dict)  # digest -> file
    tombstones: list[Path] = field(default_factory=list)


def look(*tops: Path) -> Disk:
    disk = Disk()
    for top in tops:
        for dirpath, dirnames, _ in os.walk(top):
            disk.tombstones += [Path(dirpath) / d for d in dirnames
                                if d.startswith(TOMBSTONE_PREFIX)]
        for dirpath, _, filenames in _walk(top):
            for name in filenames:
                path = dirpath / name
                if path.is_file() and not path.is_symlink():
                    digest = _digest(path.read_bytes())
                    disk.files.add(digest)
                    # The cut bytes, not the manifest: walj's own bookkeeping about them.
                    if "quarantine" in path.relative_to(top).parts and name != "MANIFEST.jsonl":
                        disk.quarantined[digest] = path
            segments = _segments(filenames)
            if not segments:
                continue
            log_id = _log_id(dirpath, segments)
            disk.sessions[dirpath] = log_id
            if log_id is None:
                continue
            try:
                for record in walj.read(dirpath):
                    disk.records[record_key(log_id, record.seq, record.data)] = dirpath
            except walj.WaljError:
                pass  # what it read before the damage stays counted; the rest is not here
    return disk


def snapshot(path: Path) -> dict[str, tuple[int, str]]:
    """Every file of the session at `path` (or folder): inode and digest of its bytes (a
    directory: inode only). A session nested in it is its own, not looked into."""
    out: dict[str, tuple[int, str]] = {}
    if not path.exists():
        return out
    nested: list[str] = []
    for dirpath, dirnames, filenames in os.walk(path):
        if Path(dirpath) != path and _segments(filenames):
            nested.append(str(Path(dirpath).relative_to(path)))
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            st = full.lstat()
            digest = _digest(full.read_bytes()) if full.is_file() and not full.is_symlink() \
                else "-"
            out[str(full.relative_to(path))] = (st.st_ino, digest)
    return {k: v for k, v in out.items()
            if not any(k == n or k.startswith(n + os.sep) for n in nested)}


@dataclass
class Archived:
    """What an archive holds that verifies."""

    records: set[RecordKey] = field(default_factory=set)
    objects: set[str] = field(default_factory=set)  # digests of every object
    chain_problems: list[str] = field(default_factory=list)


def read_archive(store: Store) -> Archived:
    out = Archived()
    log_ids: set[str] = set()
    for key, data in store.objects().items():
        out.objects.add(_digest(data))
        parts = key.split("/")
        if len(parts) != 2:
            continue
        keys = sealed_object_records(parts[0], parts[1], data)
        if keys is not None:
            out.records.update(keys)
            log_ids.add(parts[0])
    for log_id in sorted(log_ids):
        report = verify_archived(f"{store.url}/{log_id}")
        if not report.ok:
            out.chain_problems += [f"{store.url}/{log_id}: {p.describe()}"
                                   for p in report.problems[:3]]
    return out


@dataclass
class Truth:
    """Everything retention must keep, accumulated over a trial."""

    records: dict[RecordKey, Path] = field(default_factory=dict)  # -> where it was seen
    kept_bytes: dict[str, tuple[Path, int]] = field(default_factory=dict)  # digest -> file
    blockers: dict[Path, set[str]] = field(default_factory=dict)
    untouchable: dict[Path, dict[str, tuple[int, str]]] = field(default_factory=dict)

    def gather(self, tree: Any) -> None:
        """Add what the tree holds now (before a step)."""
        disk = look(tree.root, tree.outside)
        for key, path in disk.records.items():
            self.records.setdefault(key, path)
        for digest, path in disk.quarantined.items():
            self.kept_bytes.setdefault(digest, (path, path.stat().st_size))
        for path in tree.unknown:
            if path.exists():
                data = path.read_bytes()
                self.kept_bytes.setdefault(_digest(data), (path, len(data)))
        for session in disk.sessions:
            entry = check_log(str(session))
            if entry["blocked"]:
                ids = {b["execution_id"] or f"turn {b['turn_sequence']}"
                       for b in entry["blockers"]}
                self.blockers.setdefault(session, set()).update(ids)
        for session in [*tree.held, tree.outside]:
            self.untouchable.setdefault(session, snapshot(session))

    def check(self, store: Store, tree: Any, context: str, *,
              tally: bool = True) -> dict[str, int]:
        """Every invariant; raises AssertionError naming what broke. Returns the figures.
        `tally=False` for the oracle's own tests, whose losses are made on purpose and must not
        count as losses of the run the README reports."""
        disk = look(tree.root, tree.outside)
        archived = read_archive(store)
        assert not archived.chain_problems, \
            f"{context}: an archived session does not verify: {archived.chain_problems}"
        lost = [(key, path) for key, path in self.records.items()
                if key not in disk.records and key not in archived.records]
        if tally:
            TALLY.add(lost=len(lost))
        assert not lost, (f"{context}: {len(lost)} acknowledged records are neither on disk nor "
                          "in a verified archive object, e.g. " +
                          "; ".join(f"log {k[0]} seq {k[1]} of {_rel(p, tree)}"
                                    for k, p in lost[:4]))
        gone = [(path, size) for digest, (path, size) in self.kept_bytes.items()
                if digest not in disk.files and digest not in archived.objects]
        if tally:
            TALLY.add(retention_bytes_lost=sum(size for _, size in gone))
        assert not gone, (f"{context}: {sum(s for _, s in gone)} quarantined or unknown bytes "
                          "are neither on disk nor in the archive: " +
                          ", ".join(_rel(p, tree) for p, _ in gone[:4]))
        for session, ids in sorted(self.blockers.items()):
            assert session in disk.sessions, \
                f"{context}: the blocked session {_rel(session, tree)} is gone"
            entry = check_log(str(session))
            now = {b["execution_id"] or f"turn {b['turn_sequence']}" for b in entry["blockers"]}
            assert entry["blocked"] and ids <= now, \
                (f"{context}: {_rel(session, tree)} no longer blocks on "
                 f"{sorted(ids - now)[:3]} ({entry['status']}: {entry['detail']})")
        for session, before in sorted(self.untouchable.items()):
            after = snapshot(session)
            changed = sorted(k for k in before.keys() | after.keys()
                             if before.get(k) != after.get(k))
            assert not changed, (f"{context}: {_rel(session, tree)}, held by a live process "
                                 f"or outside ROOT, was touched: {changed[:4]}")
        return {"records": len(self.records), "sessions": len(disk.sessions),
                "bytes": sum(size for _, size in self.kept_bytes.values())}


def _rel(path: Path, tree: Any) -> str:
    for top, label in ((tree.root, "ROOT"), (tree.outside, "OUTSIDE")):
        if path == top or top in path.parents:
            return f"{label}/{path.relative_to(top)}"
    return str(path)
