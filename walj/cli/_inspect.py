"""`walj inspect`: a journal's recovery state (blockers, incomplete turns, pending LLM calls,
resolutions), or the whole history of one execution."""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Iterator
from typing import Any

from ..errors import CorruptionError, UnsupportedVersionError
from ..journal._decode import decode_record, time_of, turn_number
from ..journal._records import Blocker, Recovery, subject_of
from ..journal._recovery import RecoveryState
from ..log.fs import FileSystem
from ..log.scan import LogScan
from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    age,
    clock,
    duration,
    emit_json,
    last_writer,
    log_created,
    note_unrecorded,
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
from ._records import KIND_WIDTH, kind_of, summary


def feed(path: str, log_scan: LogScan, records: Iterator[tuple[int, bytes]],
         state: RecoveryState, also: Any = None) -> None:
    """Feed every record to the journal's own recovery-state rebuild (and to `also`, a callable
    taking seq and decoded data, when given). Refusals become one-line errors."""
    first = next(records, None)
    if first is None:
        return
    if kind_of(first[1]) == "-":
        raise CliError(f"{path} is a walj log but not a tool journal (record {first[0]} has "
                       "no journal kind): use dump, stats or verify")
    seq = first[0]
    try:
        if also is None:
            feed_json = state.feed_json
            feed_json(*first)
            for seq, raw in records:
                feed_json(seq, raw)
        else:
            feed_one = state.feed
            for seq, raw in itertools.chain((first,), records):
                data = decode_record(raw)
                feed_one(seq, data)
                also(seq, data)
        note_unrecorded(path, state.cuts)
    except UnsupportedVersionError as exc:
        raise CliError(f"{path}: {exc}; refusing to guess (fail closed)",
                       EXIT_PROBLEMS) from None
    except (CorruptionError, ValueError) as exc:
        damaged = ("; the log is damaged before it: see `walj verify`"
                   if log_scan.problems else "")
        raise CliError(f"{path}: journal record {seq} cannot be read: {exc}{damaged}",
                       EXIT_PROBLEMS) from None


def snapshot(path: str, state: RecoveryState) -> Recovery:
    """The recovery view; a blocker's started record is decoded only now, so it may be the one
    that cannot be read."""
    try:
        return state.snapshot()
    except CorruptionError as exc:
        raise CliError(f"{path}: journal record {exc.seq} cannot be read: {exc}",
                       EXIT_PROBLEMS) from None


def in_flight(blocker: Blocker, writer: dict[str, Any] | None) -> bool:
    """Whether a `started` blocker's call may still be running rather than interrupted: only
    when the open that wrote its started record is the one that holds the log now (its writer
    id is the one in LOCK.owner, that process runs on this host, and the kernel's table of
    locks, where there is one, shows it holding LOCK). Never for another writer's record (a
    restarted process blocked by it holds the lock), nor for one written before records
    carried a writer id."""
    return (blocker.state == "started" and blocker.writer is not None and writer is not None
            and writer.get("writer_id") == blocker.writer and writer.get("running") is True
            and writer.get("holds_lock") is not False)


def blocker_json(b: Blocker, now: float, writer: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "execution_id": b.execution_id, "tool": b.tool, "call_id": b.call_id, "state": b.state,
        "turn_sequence": b.turn_sequence, "arguments_sha256": b.arguments_sha256,
        "arguments_preview": b.arguments_preview, "idempotency_key": b.idempotency_key,
        "started_at": b.started_at, "age_seconds": age(b.started_at, now), "seq": b.seq,
        "error_type": b.error_type, "reconcile_error": b.reconcile_error,
        "arguments": b.arguments, "quarantine_file": b.quarantine_file,
        "writer_id": b.writer, "in_flight": in_flight(b, writer),
    }


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
        "resolutions": [
            {"kind": r.kind, "execution_id": r.execution_id, "turn_sequence": r.turn_sequence,
             "tool": r.tool, "outcome": r.outcome, "actor": r.actor, "note": r.note, "at": r.at,
             "seq": r.seq}
            for r in rec.resolved],
    }


def cmd_inspect(args: argparse.Namespace) -> int:
    path: str = args.path
    directory, fs, names = open_log(path, args.archive)
    if args.execution_id:
        return _inspect_execution(path, names, args.execution_id, args.json, directory, fs)
    log_scan, records = scan(directory, names, desc="rebuilding", fs=fs)
    state = RecoveryState()
    feed(path, log_scan, records, state)
    rec = snapshot(path, state)
    now = time.time()
    created = log_created(directory, names, fs)
    report: dict[str, Any] = {
        "schema": "walj.inspect/3",
        "path": path,
        "log_id": log_scan.log_id,
        "session_id": rec.session_id,
        "now": round(now, 3),
        "log_started_at": created,
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
    write_lines(_inspect_text(path, report, log_scan, rec, now))
    return code


def _inspect_text(path: str, report: dict[str, Any], log_scan: LogScan, rec: Recovery,
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
    lines += ["", "Blockers" + ("" if rec.blockers else ": none")]
    if rec.blockers:
        rows = [(b.execution_id or "-", b.tool, b.call_id, b.state, b.turn_sequence,
                 clock(b.started_at), duration(age(b.started_at, now)))
                for b in rec.blockers]
        rendered = table(("EXECUTION", "TOOL", "CALL", "STATE", "TURN", "STARTED (UTC)", "AGE"),
                         rows, right=(4,))
        lines.append(rendered[0])
        for b, row in zip(rec.blockers, rendered[1:], strict=True):
            lines.append(row)
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
    lines += ["", "Incomplete turns" + ("" if rec.incomplete_turns else ": none")]
    if rec.incomplete_turns:
        blocking = {b.turn_sequence for b in rec.blockers if b.state == "interrupted_turn"}
        rows2 = [(t.turn_sequence, clock(t.started_at), duration(age(t.started_at, now)),
                  "yes" if t.tool_bearing else "no", _turn_effect(t.turn_sequence, t.tool_bearing,
                                                                  blocking))
                 for t in rec.incomplete_turns]
        lines += table(("TURN", "STARTED (UTC)", "AGE", "USED TOOLS", "EFFECT"), rows2,
                       right=(0,))
    lines += ["", "Pending LLM calls" + ("" if rec.pending_llm_calls else ": none")]
    if rec.pending_llm_calls:
        rows3 = [(c.llm_call_id, c.model, c.turn_sequence, clock(c.started_at),
                  duration(age(c.started_at, now)), short(c.request_preview, 50))
                 for c in rec.pending_llm_calls]
        lines += table(("LLM CALL", "MODEL", "TURN", "STARTED (UTC)", "AGE", "REQUEST"), rows3,
                       right=(2,))
    lines += ["", "Resolutions" + ("" if rec.resolved else ": none")]
    if rec.resolved:
        rows4 = [(r.execution_id or f"turn {r.turn_sequence}", r.tool, r.outcome, r.actor,
                  clock(r.at), short(r.note, 60)) for r in rec.resolved]
        lines += table(("RESOLVED", "TOOL", "OUTCOME", "ACTOR", "AT (UTC)", "NOTE"), rows4)
    if rec.blocked:
        lines += ["", "Resolve each blocker on the record, once you know what happened "
                  "(`walj resolve --help` says what each outcome does):",
                  f"  walj resolve {path} EXECUTION --outcome succeeded|failed|not_performed "
                  "--note TEXT --actor NAME",
                  f"  walj resolve {path} --turn N --note TEXT --actor NAME"]
        if any(b.quarantine_file for b in rec.blockers):
            lines.append(f"  walj resolve {path} QUARANTINE_FILE --outcome reviewed "
                         "--note TEXT --actor NAME")
    return lines


def _turn_effect(sequence: int, tool_bearing: bool, blocking: set[int | None]) -> str:
    if sequence in blocking:
        return "blocks: resolve the turn"
    if tool_bearing:
        return "resolved with its ambiguous execution"
    return "none (used no tools)"


# --- one execution --------------------------------------------------------------------------


def _inspect_execution(path: str, names: list[str], wanted: str, as_json: bool,
                       directory: str, fs: FileSystem) -> int:
    """Every record of one execution (its id, or a unique prefix of at least 6 characters)."""
    if len(wanted) < 6:
        raise CliError("give the execution id, or a unique prefix of at least 6 characters")
    log_scan, records = scan(directory, names, desc="searching", fs=fs)
    state = RecoveryState()
    found: list[tuple[int, dict[str, Any]]] = []
    ids: set[str] = set()

    def collect(seq: int, data: Any) -> None:
        eid = subject_of(data)
        if isinstance(eid, str) and eid.startswith(wanted):
            ids.add(eid)
            found.append((seq, data))

    feed(path, log_scan, records, state, collect)
    if not ids:
        raise CliError(f"unknown execution id {wanted!r} in {path}")
    if len(ids) > 1:
        raise CliError(f"{wanted!r} is a prefix of {len(ids)} execution ids: give more of it")
    (execution_id,) = ids
    now = time.time()
    blocker = next((b for b in snapshot(path, state).blockers
                    if b.execution_id == execution_id), None)
    writer = last_writer(path) if blocker is not None else None
    started = next((d for _, d in found if d.get("kind") == "tool_execution_started"), None)
    first = found[0][1]
    terminal = next((d for _, d in found if d.get("kind") in (
        "tool_execution_finished", "tool_execution_resolved", "tool_execution_blocked",
        "tool_execution_refused", "llm_call_finished", "llm_call_resolved")), None)
    if blocker is not None:
        status = f"blocker ({blocker.state})"
    elif terminal is None:
        status = "pending" if first.get("kind") == "llm_call_started" else "open"
    elif terminal.get("kind") == "tool_execution_blocked":
        status = "blocked (the journal was blocked; nothing ran)"
    elif terminal.get("kind") == "tool_execution_refused":
        status = (f"refused (call id already settled: "
                  f"{opt_str(terminal.get('refused_reason')) or '?'}; nothing ran)")
    elif terminal.get("kind") in ("tool_execution_resolved", "llm_call_resolved"):
        status = (f"resolved: {opt_str(terminal.get('outcome')) or '?'} by "
                  f"{opt_str(terminal.get('actor')) or '?'}")
    else:
        status = f"finished: {opt_str(terminal.get('outcome')) or '?'}"
    report = {
        "schema": "walj.execution/5",
        "path": path,
        "execution_id": execution_id,
        "kind": "llm_call" if str(first.get("kind", "")).startswith("llm_") else "tool_execution",
        "tool": opt_str(first.get("tool")),
        "call_id": opt_str(first.get("call_id")),
        "turn_sequence": turn_number(first.get("turn_sequence")),
        "status": status,
        "blocker": None if blocker is None else blocker_json(blocker, now, writer),
        "records": [{"seq": seq, "data": data} for seq, data in found],
    }
    code = EXIT_PROBLEMS if blocker is not None or log_scan.problems else EXIT_OK
    if as_json:
        emit_json(report)
        return code
    lines = [f"execution  {execution_id}",
             f"tool       {report['tool'] or '-'} (call {report['call_id'] or '-'}, turn "
             f"{report['turn_sequence'] if report['turn_sequence'] is not None else '-'})",
             f"status     {status}"]
    if blocker is not None and writer is not None and in_flight(blocker, writer):
        lines.append(f"note       the writer that started it (pid {writer['pid']}, since "
                     f"{writer['since']}) still holds the log: it may be in flight, not "
                     "interrupted")
    if started is not None:
        lines.append(f"arguments  sha256:{short(started.get('arguments_sha256'), 64)}  "
                     f"{short(started.get('arguments_preview'), 160)}")
        lines.append(f"idem. key  {short(started.get('idempotency_key'), 64)}")
    lines += ["", "Records"]
    rows = [(seq, clock(time_of(d.get("at"))), short(d.get("kind"), KIND_WIDTH),
             short(summary(d), 100)) for seq, d in found]
    lines += table(("SEQ", "TIME (UTC)", "KIND", "SUMMARY"), rows, right=(0,))
    write_lines(lines)
    return code
