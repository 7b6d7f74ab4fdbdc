"""`walj inspect`: a journal's recovery state (blockers, incomplete turns, pending LLM calls,
resolutions), or the whole history of one execution."""

from __future__ import annotations

import argparse
import shlex
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import CorruptionError, UnsupportedVersionError
from ..journal import Resolution
from ..log.fs import FileSystem
from ..log.scan import LogScan
from ._approvalview import APPROVAL_HEADERS, approval_rows, open_approvals
from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    clock,
    duration,
    emit_json,
    last_writer,
    log_created,
    open_log,
    opt_str,
    plural,
    problem_json,
    scan,
    short,
    table,
    torn_json,
    write_lines,
)
from ._model import (
    Blocker,
    JournalState,
    Recovery,
    age,
    blocker_json,
    in_flight,
    note_unrecorded,
    rebuild,
    subject_of,
    time_of,
    turn_number,
)
from ._records import KIND_WIDTH, summary


def journal_state(path: str, log_scan: LogScan, records: Iterator[tuple[int, bytes]],
                  also: Any = None, state: JournalState | None = None) -> JournalState:
    """The journal's state rebuilt from every record (each also given to `also`, a callable
    taking seq and decoded data, when given). Refusals become one-line errors."""
    done = rebuild(records, also, state)
    if done.plain:
        raise CliError(f"{path} is a walj log but not a tool journal (record {done.seq} has "
                       "no journal kind): use dump, stats or verify")
    try:
        if done.refusal is not None:
            raise done.refusal
        if done.seq:
            note_unrecorded(path, done.state.cuts)
    except UnsupportedVersionError as exc:
        raise CliError(f"{path}: {exc}; refusing to guess (fail closed)",
                       EXIT_PROBLEMS) from None
    except (CorruptionError, ValueError) as exc:
        damaged = ("; the log is damaged before it: see `walj verify`"
                   if log_scan.problems else "")
        raise CliError(f"{path}: journal record {done.seq} cannot be read: {exc}{damaged}",
                       EXIT_PROBLEMS) from None
    return done.state


def snapshot(path: str, state: JournalState) -> Recovery:
    """The recovery view; a blocker's started record is decoded only now, so it may be the one
    that cannot be read."""
    try:
        return state.snapshot()
    except CorruptionError as exc:
        raise CliError(f"{path}: journal record {exc.seq} cannot be read: {exc}",
                       EXIT_PROBLEMS) from None


def recovery_json(rec: Recovery, now: float,
                  writer: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "blocked": rec.blocked,
        "blockers": [blocker_json(b, now, writer) for b in rec.blockers],
        "incomplete_turns": [
            {"turn_sequence": t.turn_sequence, "started_at": t.started_at,
             "age_seconds": age(t.started_at, now), "seq": t.seq, "tool_bearing": t.tool_bearing}
            for t in rec.incomplete_turns],
        "pending_llm_calls": [
            {"llm_call_id": c.llm_call_id, "model": c.model, "turn_sequence": c.turn_sequence,
             "started_at": c.started_at, "age_seconds": age(c.started_at, now), "seq": c.seq,
             "request_sha256": c.request_sha256, "request_preview": c.request_preview}
            for c in rec.pending_llm_calls],
        "resolutions": [resolution_json(r) for r in rec.resolved],
        # Never blockers: a pending request holds back only its own call.
        "approvals": open_approvals(rec, now),
    }


def resolution_json(r: Resolution) -> dict[str, Any]:
    return {"kind": r.kind, "execution_id": r.execution_id, "turn_sequence": r.turn_sequence,
            "tool": r.tool, "outcome": r.outcome, "actor": r.actor, "note": r.note, "at": r.at,
            "seq": r.seq}


def cmd_inspect(args: argparse.Namespace) -> int:
    path: str = args.path
    directory, fs, names = open_log(path, args.archive)
    if args.execution_id:
        return _inspect_execution(path, names, args.execution_id, args.json, directory, fs)
    log_scan, records = scan(directory, names, desc="rebuilding", fs=fs)
    rec = snapshot(path, journal_state(path, log_scan, records))
    now = time.time()
    report: dict[str, Any] = {
        "schema": "walj.inspect/3",
        "path": path,
        "log_id": log_scan.log_id,
        "session_id": rec.session_id,
        "now": round(now, 3),
        "log_started_at": log_created(directory, names, fs),
        "records": log_scan.records,
        "last_seq": log_scan.last_seq,
        "log_ok": not log_scan.problems,
        "problems": [problem_json(p) for p in log_scan.problems],
        "torn_tail": torn_json(log_scan.torn_tail),
        "writer": last_writer(path),
    }
    report.update(recovery_json(rec, now, report["writer"]))
    code = EXIT_PROBLEMS if rec.blocked or log_scan.problems else EXIT_OK
    if args.json:
        emit_json(report)
        return code
    write_lines(_inspect_lines(path, report, log_scan, rec, now))
    return code


def _inspect_lines(path: str, report: dict[str, Any], log_scan: LogScan, rec: Recovery,
                   now: float) -> list[str]:
    blocking = {b.turn_sequence for b in rec.blockers if b.state == "interrupted_turn"}
    turns = [(t.turn_sequence, clock(t.started_at), duration(age(t.started_at, now)),
              "yes" if t.tool_bearing else "no",
              _turn_effect(t.turn_sequence, t.tool_bearing, blocking))
             for t in rec.incomplete_turns]
    calls = [(c.llm_call_id, c.model, c.turn_sequence, clock(c.started_at),
              duration(age(c.started_at, now)), short(c.request_preview, 50))
             for c in rec.pending_llm_calls]
    resolved = [(r.execution_id or f"turn {r.turn_sequence}", r.tool, r.outcome, r.actor,
                 clock(r.at), short(r.note, 60)) for r in rec.resolved]
    return [*_state_lines(path, report, log_scan, rec, now),
            *_blocker_lines(rec.blockers, now),
            *_section("Incomplete turns", ("TURN", "STARTED (UTC)", "AGE", "USED TOOLS",
                                           "EFFECT"), turns, right=(0,)),
            *_section("Pending LLM calls", ("LLM CALL", "MODEL", "TURN", "STARTED (UTC)",
                                            "AGE", "REQUEST"), calls, right=(2,)),
            *_section("Resolutions", ("RESOLVED", "TOOL", "OUTCOME", "ACTOR", "AT (UTC)",
                                      "NOTE"), resolved),
            *_approval_lines(path, report["approvals"], now),
            *_next_lines(path, rec)]


def _approval_lines(path: str, approvals: list[dict[str, Any]], now: float) -> list[str]:
    """Pending requests and unused approvals, each with its arguments' fingerprint: what a
    person approves is exactly those arguments."""
    lines = _section("Approvals", APPROVAL_HEADERS, approval_rows(approvals, now))
    for entry in approvals:
        decided = "" if entry["actor"] is None else f"  {entry['status']} by {entry['actor']}"
        note = "" if entry["note"] is None else f": {short(entry['note'], 60)}"
        lines.append(f"  {entry['approval_id']}  sha256:{entry['arguments_sha256']}{decided}"
                     f"{note}")
    if any(e["status"] == "pending" for e in approvals):
        lines += ["", "Each pending request holds back its own call only (nothing else is "
                  "blocked); decide it on the record:",
                  f"  walj approve {path} APPROVAL --actor NAME [--note TEXT] "
                  "[--expires-in DURATION]",
                  f"  walj deny {path} APPROVAL --actor NAME [--note TEXT]"]
    return lines


def _section(title: str, headers: tuple[str, ...], rows: list[tuple[Any, ...]],
             right: tuple[int, ...] = ()) -> list[str]:
    """A titled table, or the title saying there is none."""
    if not rows:
        return ["", f"{title}: none"]
    return ["", title, *table(headers, rows, right=right)]


def _state_lines(path: str, report: dict[str, Any], log_scan: LogScan, rec: Recovery,
                 now: float) -> list[str]:
    started = report["log_started_at"]
    lines = [
        f"log      {path}",
        f"         id {log_scan.log_id or '-'}, {plural(log_scan.records, 'record')}, "
        f"last seq {log_scan.last_seq}",
        f"started  {clock(started)} UTC ({duration(age(started, now))} ago)",
    ]
    if rec.session_id is not None:  # write_lines shows its control characters as escapes
        lines.append(f"session  {rec.session_id}")
    if rec.blocked:
        lines.append(f"state    BLOCKED by {plural(len(rec.blockers), 'blocker')}: every "
                     "dispatch is blocked (no tool runs) until each is resolved")
    else:
        lines.append("state    not blocked: dispatch runs tools")
    if log_scan.problems:
        lines.append(f"WARNING  the log has {plural(len(log_scan.problems), 'problem')}; this "
                     f"state is rebuilt from the records that verify (`walj verify {path}`)")
    writer = report["writer"]
    running = [short(b.execution_id, 32) for b in rec.blockers if in_flight(b, writer)]
    if running:
        lines.append(f"note     {', '.join(running)} may be in flight, not interrupted: the "
                     f"process that started {'it' if len(running) == 1 else 'them'} (pid "
                     f"{writer['pid']}, since {writer['since']}) still holds the log")
    if log_scan.torn_tail is not None:
        torn = log_scan.torn_tail
        lines.append(f"note     torn tail of {torn.length:,} bytes in {torn.file} (a write in "
                     "progress, or a crash mid-append)")
    return lines


def _blocker_lines(blockers: Sequence[Blocker], now: float) -> list[str]:
    lines = ["", "Blockers" + ("" if blockers else ": none")]
    if not blockers:
        return lines
    rows = [(b.execution_id or "-", b.tool, b.call_id, b.state, b.turn_sequence,
             clock(b.started_at), duration(age(b.started_at, now))) for b in blockers]
    rendered = table(("EXECUTION", "TOOL", "CALL", "STATE", "TURN", "STARTED (UTC)", "AGE"),
                     rows, right=(4,))
    lines.append(rendered[0])
    for b, row in zip(blockers, rendered[1:], strict=True):
        lines.append(row)
        lines += _blocker_details(b)
    return lines


def _blocker_details(b: Blocker) -> list[str]:
    lines = []
    if b.arguments_sha256:
        lines.append(f"      fingerprint  sha256:{b.arguments_sha256}")
    if b.quarantine_file is not None:
        lines.append(f"      cut bytes    {b.quarantine_file} in quarantine/")
        lines.append(f"      why          {short(b.arguments_preview, 200)}")
    elif b.arguments_preview is not None:
        lines.append(f"      arguments    {short(b.arguments_preview, 200)}")
    if b.idempotency_key:
        lines.append(f"      idem. key    {b.idempotency_key}")
    if b.error_type:
        lines.append(f"      interrupted  by {b.error_type}")
    if b.reconcile_error:
        lines.append(f"      reconcile    failed: {short(b.reconcile_error, 160)}")
    return lines


def resolve_command(path: str, blocker: Blocker) -> str:
    """The `walj resolve` command that settles `blocker` once a person knows what happened:
    `inspect` prints it and `report` shows it. NOTE and NAME (and, for an execution, one of
    the outcomes) are the person's to fill in; the path and the id are quoted for a shell."""
    where = shlex.quote(path)
    if blocker.quarantine_file is not None:
        return (f"walj resolve {where} {shlex.quote(blocker.quarantine_file)} --outcome reviewed "
                "--note TEXT --actor NAME")
    if blocker.execution_id is None:  # an interrupted turn
        return f"walj resolve {where} --turn {blocker.turn_sequence} --note TEXT --actor NAME"
    return (f"walj resolve {where} {shlex.quote(blocker.execution_id)} "
            "--outcome succeeded|failed|not_performed --note TEXT --actor NAME")


def _next_lines(path: str, rec: Recovery) -> list[str]:
    if not rec.blocked:
        return []
    return ["", "Resolve each blocker on the record, once you know what happened "
            "(`walj resolve --help` says what each outcome does):",
            *(f"  {resolve_command(path, b)}" for b in rec.blockers)]


def _turn_effect(sequence: int, tool_bearing: bool, blocking: set[int | None]) -> str:
    if sequence in blocking:
        return "blocks: resolve the turn"
    if tool_bearing:
        return "resolved with its ambiguous execution"
    return "none (used no tools)"


# --- one execution --------------------------------------------------------------------------

# The records that settle an execution or an LLM call, in the status each gives.
_TERMINAL = ("tool_execution_finished", "tool_execution_resolved", "tool_execution_blocked",
             "tool_execution_refused", "llm_call_finished", "llm_call_resolved")


def _inspect_execution(path: str, names: list[str], wanted: str, as_json: bool,
                       directory: str, fs: FileSystem) -> int:
    """Every record of one execution (its id, or a unique prefix of at least 6 characters)."""
    if len(wanted) < 6:
        raise CliError("give the execution id, or a unique prefix of at least 6 characters")
    log_scan, records = scan(directory, names, desc="searching", fs=fs)
    found: list[tuple[int, dict[str, Any]]] = []
    ids: set[str] = set()

    def collect(seq: int, data: Any) -> None:
        eid = subject_of(data)
        if isinstance(eid, str) and eid.startswith(wanted):
            ids.add(eid)
            found.append((seq, data))

    state = journal_state(path, log_scan, records, collect)
    if not ids:
        raise CliError(f"unknown execution id {wanted!r} in {path}")
    if len(ids) > 1:
        raise CliError(f"{wanted!r} is a prefix of {len(ids)} execution ids: give more of it")
    (execution_id,) = ids
    blocker = next((b for b in snapshot(path, state).blockers
                    if b.execution_id == execution_id), None)
    writer = last_writer(path) if blocker is not None else None
    report = _execution_json(path, execution_id, found, blocker, writer)
    code = EXIT_PROBLEMS if blocker is not None or log_scan.problems else EXIT_OK
    if as_json:
        emit_json(report)
        return code
    write_lines(_execution_text(report, found, blocker, writer))
    return code


def _execution_json(path: str, execution_id: str, found: list[tuple[int, dict[str, Any]]],
                    blocker: Blocker | None, writer: dict[str, Any] | None) -> dict[str, Any]:
    first = found[0][1]
    return {
        "schema": "walj.execution/5",
        "path": path,
        "execution_id": execution_id,
        "kind": "llm_call" if str(first.get("kind", "")).startswith("llm_") else "tool_execution",
        "tool": opt_str(first.get("tool")),
        "call_id": opt_str(first.get("call_id")),
        "turn_sequence": turn_number(first.get("turn_sequence")),
        "status": _status(found, blocker),
        "blocker": None if blocker is None else blocker_json(blocker, time.time(), writer),
        "records": [{"seq": seq, "data": data} for seq, data in found],
    }


def _status(found: list[tuple[int, dict[str, Any]]], blocker: Blocker | None) -> str:
    """Where the execution stands, from its blocker or the record that settled it."""
    if blocker is not None:
        return f"blocker ({blocker.state})"
    terminal = next((d for _, d in found if d.get("kind") in _TERMINAL), None)
    if terminal is None:
        return "pending" if found[0][1].get("kind") == "llm_call_started" else "open"
    kind = terminal.get("kind")
    if kind == "tool_execution_blocked":
        return "blocked (the journal was blocked; nothing ran)"
    if kind == "tool_execution_refused":
        return (f"refused (call id already settled: "
                f"{opt_str(terminal.get('refused_reason')) or '?'}; nothing ran)")
    if kind in ("tool_execution_resolved", "llm_call_resolved"):
        return (f"resolved: {opt_str(terminal.get('outcome')) or '?'} by "
                f"{opt_str(terminal.get('actor')) or '?'}")
    return f"finished: {opt_str(terminal.get('outcome')) or '?'}"


def _execution_text(report: dict[str, Any], found: list[tuple[int, dict[str, Any]]],
                    blocker: Blocker | None, writer: dict[str, Any] | None) -> list[str]:
    turn = report["turn_sequence"]
    lines = [f"execution  {report['execution_id']}",
             f"tool       {report['tool'] or '-'} (call {report['call_id'] or '-'}, turn "
             f"{turn if turn is not None else '-'})",
             f"status     {report['status']}"]
    if blocker is not None and writer is not None and in_flight(blocker, writer):
        lines.append(f"note       the writer that started it (pid {writer['pid']}, since "
                     f"{writer['since']}) still holds the log: it may be in flight, not "
                     "interrupted")
    started = next((d for _, d in found if d.get("kind") == "tool_execution_started"), None)
    if started is not None:
        lines.append(f"arguments  sha256:{short(started.get('arguments_sha256'), 64)}  "
                     f"{short(started.get('arguments_preview'), 160)}")
        lines.append(f"idem. key  {short(started.get('idempotency_key'), 64)}")
    lines += ["", "Records"]
    rows = [(seq, clock(time_of(d.get("at"))), short(d.get("kind"), KIND_WIDTH),
             short(summary(d), 100)) for seq, d in found]
    lines += table(("SEQ", "TIME (UTC)", "KIND", "SUMMARY"), rows, right=(0,))
    return lines
