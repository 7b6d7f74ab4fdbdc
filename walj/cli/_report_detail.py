"""What `walj report` gathers of one session in full: its last turns as a timeline of calls,
its blockers with the command that settles each, its resolutions, and the verification of
its segments and seal chain; every list bounded (the limits below, docs/CLI.md "report")."""

from __future__ import annotations

import time
from typing import Any

from ..archive import ArchiveError, is_url
from ..errors import WaljError
from ..log.ends import read_ends
from ..log.fs import DEFAULT_FS, FileSystem
from ..log.scan import LogScan
from ._common import last_writer, opt_str, problem_json, torn_json
from ._inspect import resolution_json, resolve_command
from ._model import JournalState, blocker_json, note_unrecorded, rebuild, subject_of
from ._report_approvals import ApprovalRecords
from ._sweep import check_archived, check_log
from ._timeline import Builder, turns_json

# One session's detail holds at most: the last TURNS turns, ITEMS_PER_TURN calls of each, the
# first BLOCKERS blockers, the last RESOLUTIONS resolutions, PROBLEMS problems, and the rows of
# SEGMENTS segments with a problem and of the last SEGMENTS segments (the others are counted).
TURNS = 20
ITEMS_PER_TURN = 40
BLOCKERS = 50
RESOLUTIONS = 20
PROBLEMS = 20
SEGMENTS = 10

# The resolve command of an archived copy names the session's own directory, which a report
# of the archive cannot know: resolving writes there, never to the archive.
ARCHIVED_SESSION = "SESSION_DIR"

# Problem kinds that break the seal chain (docs/FORMAT.md): a seal that does not match its
# segment, a header that does not name the seal before it, a segment missing, unsealed before
# the last, or of another log, and a base marker that does not hold.
CHAIN_KINDS = frozenset({"seal_mismatch", "seal_chain", "missing_segment", "unsealed_segment",
                         "foreign_segment", "data_after_seal", "bad_header", "bad_base",
                         "base_mismatch"})


def open_session(path: str, archive: str | None) -> tuple[str, FileSystem, str]:
    """(directory, file system, source) of a session: a local directory, an archived
    session's URL, or, with `archive`, a local directory read after its archived segments.
    A local session with nothing in the archive is read alone (its source says why)."""
    from ..archive._view import open_view

    if is_url(path):
        view = open_view(path)
        return view.directory, view, "archive"
    if archive is None:
        return path, DEFAULT_FS, "local"
    try:
        view = open_view(archive, local=path)
    except ArchiveError as exc:
        return path, DEFAULT_FS, f"local only ({exc})"
    return view.directory, view, "archive + local"


def check_session(path: str, archive: str | None = None) -> dict[str, Any]:
    """`walj sweep`'s check of one session (its status, blockers, problems, last activity),
    read as `open_session` reads it. Never raises: a failure is the session's status."""
    if is_url(path):
        return check_archived(path)
    if archive is None:
        return check_log(path)
    try:
        directory, fs, source = open_session(path, archive)
    except (OSError, WaljError) as exc:
        return check_log(path) | {"detail": f"archive: {exc}"}
    entry = check_log(directory, fs)
    entry["path"] = path
    entry["source"] = source
    return entry


def session_detail(path: str, archive: str | None = None) -> dict[str, Any]:
    """A session in full, as plain data (it crosses process boundaries). Never raises: what
    cannot be read is in `error`."""
    try:
        directory, fs, source = open_session(path, archive)
        return _detail(path, directory, fs, source)
    except (OSError, WaljError, ImportError, ValueError, RecursionError) as exc:
        return {"path": path, "error": " ".join(str(exc).split()) or type(exc).__name__}


class _Reader:
    """Takes each decoded record after the journal's state did: the timeline's builder, the
    approval requests, and each execution's arguments and output previews."""

    def __init__(self) -> None:
        self.builder = Builder(JournalState())
        self.approvals = ApprovalRecords()
        self.previews: dict[str, Any] = {}  # execution id: its arguments' preview
        self.outputs: dict[str, Any] = {}  # execution id: its output's preview

    def __call__(self, seq: int, data: Any) -> None:
        self.builder(seq, data)
        self.approvals(seq, data)
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind not in ("tool_execution_started", "tool_execution_finished"):
            return
        eid = subject_of(data)
        if isinstance(eid, str) and kind == "tool_execution_started":
            self.previews[eid] = data.get("arguments_preview")
        elif isinstance(eid, str):
            self.outputs[eid] = data.get("output_preview")


def _detail(path: str, directory: str, fs: FileSystem, source: str) -> dict[str, Any]:
    log_scan = LogScan(directory, mode="salvage", fs=fs)
    reader = _Reader()
    builder = reader.builder
    records = iter(log_scan)
    done = rebuild(records, reader, builder.state)
    for _ in records:  # after a refusal, or a plain log's first record: verify the rest
        pass
    finish = getattr(fs, "finish", None)
    if finish is not None:
        finish(log_scan)
    detail: dict[str, Any] = {
        "path": path, "source": source, "log_id": log_scan.log_id,
        "records": log_scan.records, "last_seq": log_scan.last_seq,
        "problem_count": len(log_scan.problems),
        "problems": [problem_json(p) for p in log_scan.problems[:PROBLEMS]],
        "torn_tail": torn_json(log_scan.torn_tail),
        "verification": verification(directory, fs, log_scan),
        "journal": None, "blocked": False, "blockers": [], "blocker_count": 0,
        "resolutions": [], "resolution_count": 0, "turns": [], "turn_count": 0,
        "approvals": [], "approval_count": 0, "pending_approvals": 0}
    if done.plain:
        detail["journal"] = "a plain walj log, not a tool journal: no turns or calls"
        return detail
    try:
        if done.refusal is not None:
            raise done.refusal
        if done.seq:
            note_unrecorded(directory, builder.state.cuts)
        rec = builder.state.snapshot()
    except (WaljError, ValueError, OSError) as exc:
        detail["journal"] = f"journal record {done.seq} cannot be read: {exc}"
        return detail
    now = time.time()
    command_path = ARCHIVED_SESSION if is_url(path) else path
    # Whether a blocker may be a call in flight: as `walj inspect` tells it (LOCK.owner).
    writer = last_writer(path) if rec.blockers and not is_url(path) else None
    turns = turns_json(builder, rec, TURNS)
    shown, count = reader.approvals.rows(rec, now)
    asked: dict[int | None, list[dict[str, Any]]] = {}  # turn: the approvals its calls asked
    for request in reader.approvals.requests.values():
        asked.setdefault(request["turn_sequence"], []).append({**request, "type": "approval"})
    for turn in turns:
        for execution in turn["executions"]:
            eid = execution["execution_id"]
            execution["arguments_preview"] = opt_str(reader.previews.get(eid))
            execution["output_preview"] = opt_str(reader.outputs.get(eid))
    detail.update(
        blocked=rec.blocked, blocker_count=len(rec.blockers),
        writer=writer, approvals=shown, approval_count=count,
        pending_approvals=len(getattr(rec, "approvals", ())),
        blockers=[{**blocker_json(b, now, writer), "command": resolve_command(command_path, b)}
                  for b in rec.blockers[:BLOCKERS]],
        resolution_count=len(rec.resolved),
        resolutions=[resolution_json(r) for r in rec.resolved[-RESOLUTIONS:]],
        turn_count=len(builder.order),
        turns=[_bounded(turn, asked.get(turn["turn_sequence"], [])) for turn in turns])
    return detail


def _bounded(turn: dict[str, Any], asked: list[dict[str, Any]]) -> dict[str, Any]:
    """A turn's calls in log order, with the approvals they asked for (no handler ran for
    those), at most ITEMS_PER_TURN of them (the rest counted)."""
    items: list[dict[str, Any]] = list(asked)
    for kind in ("executions", "blocked", "replayed", "refused", "llm_calls"):
        items += [{**item, "type": kind} for item in turn[kind]]
    items.sort(key=lambda item: int(item["seq"]))
    head = {k: v for k, v in turn.items()
            if k not in ("executions", "blocked", "replayed", "refused", "llm_calls")}
    return {**head, "items": items[:ITEMS_PER_TURN], "item_count": len(items)}


def verification(directory: str, fs: FileSystem, log_scan: LogScan) -> dict[str, Any]:
    """Each segment's verdict (its seal, if sealed, and the kinds of its problems) and the
    seal chain's: rows for the segments with a problem and the last ones, the rest counted."""
    names = log_scan.segments
    kinds: dict[str, list[str]] = {}
    for problem in log_scan.problems:
        kinds.setdefault(problem.file, []).append(problem.kind)
    damaged = [name for name in names if name in kinds][:SEGMENTS]
    shown = sorted(set(damaged) | set(names[-SEGMENTS:]))
    rows = [_segment_row(directory, fs, name, kinds.get(name, []), name == names[-1])
            for name in shown]
    broken = sorted({kind for found in kinds.values() for kind in found if kind in CHAIN_KINDS})
    head = next((row["sha256"] for row in reversed(rows) if row["sha256"]), None)
    base = log_scan.base
    return {"segment_count": len(names), "segments": rows,
            "ok_count": sum(1 for name in names if name not in kinds),
            "chain_ok": not broken, "chain_problems": broken, "chain_head": head,
            "base": None if base is None else {"segment": base.index,
                                                "first_seq": base.first_seq},
            "other_problems": sorted({kind for file, found in kinds.items()
                                      if file not in set(names) for kind in found})}


def _segment_row(directory: str, fs: FileSystem, name: str, problems: list[str],
                 last: bool) -> dict[str, Any]:
    try:
        header, seal = read_ends(fs, directory, name)
    except OSError:
        header, seal = None, None
    return {"name": name, "first_seq": None if header is None else header.first_seq,
            "sealed": seal is not None, "records": None if seal is None else seal.records,
            "last_seq": None if seal is None else seal.last_seq,
            "sha256": None if seal is None else seal.sha256, "last": last,
            "problems": sorted(set(problems))}
