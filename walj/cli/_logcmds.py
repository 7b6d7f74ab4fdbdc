"""`walj verify` and `walj stats`: the log's integrity, and what it holds in numbers."""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from ..archive import is_url
from ..errors import CorruptionError
from ..log import format as fmt
from ..log.format import MANIFEST, QUARANTINE_DIR
from ..log.fs import open_regular
from ..log.segment import Problem
from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    clock,
    duration,
    emit_json,
    log_created,
    open_log,
    opt_str,
    plural,
    problem_json,
    scan,
    segment_bytes,
    segment_names,
    short,
    table,
    torn_json,
    write_lines,
)
from ._model import decode_record, subject_of, time_of

# --- verify ---------------------------------------------------------------------------------


def quarantine_entries(path: str) -> list[dict[str, Any]]:
    """The lines of quarantine/MANIFEST.jsonl (what was cut off this log, and when)."""
    manifest = os.path.join(path, QUARANTINE_DIR, MANIFEST)
    entries: list[dict[str, Any]] = []
    try:
        # Never a blocking open: a FIFO named like the manifest would hang `walj verify`.
        with os.fdopen(open_regular(manifest, os.O_RDONLY), "rb") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    entries.append({k: entry.get(k) for k in
                                    ("file", "segment", "offset", "length", "kind", "time")})
    except (OSError, CorruptionError):
        pass  # no readable manifest: nothing listed
    return entries


def cmd_verify(args: argparse.Namespace) -> int:
    path: str = args.path
    directory, fs, names = open_log(path, args.archive)
    log_scan, records = scan(directory, names, desc="verifying", fs=fs)
    for _ in records:
        pass
    torn = log_scan.torn_tail
    base = log_scan.base
    ok = not log_scan.problems and not (args.strict and torn is not None)
    archived_cuts = getattr(fs, "quarantine_entries", None)  # an archive view: its own cuts
    report: dict[str, Any] = {
        "schema": "walj.verify/2",
        "path": path,
        "ok": ok,
        "log_id": log_scan.log_id,
        "format_version": fmt.FORMAT_VERSION,
        "records": log_scan.records,
        "last_seq": log_scan.last_seq,
        "segments": list(log_scan.segments),
        "bytes": segment_bytes(directory, names, fs),
        "torn_tail": torn_json(torn),
        "problems": [problem_json(p) for p in log_scan.problems],
        "quarantine": archived_cuts() if archived_cuts else quarantine_entries(path),
        # A compacted log (Log.drop_before) begins at its base marker (schema 2).
        "base": None if base is None else {"segment": base.index, "first_seq": base.first_seq,
                                           "prev": base.prev_seal},
        "leftovers": list(log_scan.leftovers),
    }
    if args.json:
        emit_json(report)
    else:
        write_lines([*_verify_lines(report, args.strict, archived_cuts is not None),
                     *_problem_lines(path, log_scan.problems)])
    return EXIT_OK if ok else EXIT_PROBLEMS


def _verify_lines(report: dict[str, Any], strict: bool, archived: bool) -> list[str]:
    base, torn, cuts = report["base"], report["torn_tail"], report["quarantine"]
    first = (base["first_seq"] if base is not None else 1) if report["records"] else 0
    lines = [
        f"{report['path']}: {'ok' if report['ok'] else 'PROBLEMS FOUND'}",
        f"  {plural(report['records'], 'record')} (seq {first}-{report['last_seq']}) in "
        f"{plural(len(report['segments']), 'segment')}, {report['bytes']:,} bytes; "
        f"log id {report['log_id'] or '-'}",
        "  checked: line checksums (XXH64), seq continuity, segment headers and format "
        f"version {fmt.FORMAT_VERSION}, seals and the seal chain",
    ]
    leftovers = report["leftovers"]
    if base is not None:
        lines.append(f"  compacted: begins at segment {base['segment']}, seq {base['first_seq']} "
                     f"(BASE); the chain is verified from there"
                     + (f"; {plural(len(leftovers), 'leftover segment')} of an "
                        "interrupted drop below it, not read" if leftovers else ""))
    if torn is not None:
        lines.append(f"  torn tail: {torn['file']} at byte {torn['offset']:,}, "
                     f"{torn['length']:,} bytes ({torn['kind']}): a write in progress or a "
                     "crash mid-append; the next writer moves it to quarantine/"
                     + (" [--strict: a problem]" if strict else ""))
    if cuts:
        cut = sum(e["length"] for e in cuts if type(e.get("length")) is int)
        lines.append(f"  quarantine: {plural(len(cuts), 'earlier cut')} ({cut:,} bytes) kept "
                     f"in {QUARANTINE_DIR}/"
                     + (", each checked against its manifest line" if archived else ""))
    return lines


def _problem_lines(path: str, problems: list[Problem]) -> list[str]:
    if not problems:
        return []
    rows = [(p.file, f"{p.offset:,}", p.seq, p.kind, short(p.detail, 70)) for p in problems]
    if is_url(path):  # an archive is never repaired in place
        repair = ("`walj archive SESSION_DIR --to ARCHIVE` writes again every archived object "
                  "that is a partial or damaged copy of the session's own files.")
    else:
        repair = (f"`walj repair {path}` cuts the damaged suffix into quarantine/ (see "
                  "--dry-run first).")
    return ["", f"{plural(len(problems), 'problem')}:",
            *table(("FILE", "OFFSET", "SEQ", "KIND", "DETAIL"), rows, right=(1, 2)), "", repair]


# --- stats ----------------------------------------------------------------------------------


@dataclass
class ToolStats:
    """One tool's dispatches, each counted under the outcome the API gave it."""

    calls: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # of tool_execution_finished
    ambiguous: int = 0  # started, and no tool_execution_finished (open, or resolved)
    journal_blocked: int = 0  # tool_execution_blocked: outcome blocked, no intent written
    replayed: int = 0
    refused: int = 0
    durations: list[float] = field(default_factory=list)

    @property
    def finished(self) -> int:
        return sum(self.outcomes.values())

    def error_rate(self) -> float | None:
        return round(self.outcomes.get("error", 0) / self.finished, 4) if self.finished else None


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of already sorted values."""
    if not values:
        return None
    rank = max(1, math.ceil(fraction * len(values)))
    return values[rank - 1]


@dataclass
class ApprovalCounts:
    """Approval requests and what became of each, from the records alone: `pending` and
    `approved_unused` are the requests no decision, or no intent, has answered yet."""

    requested: set[str] = field(default_factory=set)
    approved: set[str] = field(default_factory=set)
    denied: set[str] = field(default_factory=set)
    consumed: set[str] = field(default_factory=set)

    def add(self, kind: str, data: dict[str, Any]) -> None:
        aid = data.get("approval_id")
        if not isinstance(aid, str):
            return
        if kind == "tool_approval_requested":
            self.requested.add(aid)
        elif kind == "tool_approval_decided" and aid not in self.approved | self.denied:
            decision = data.get("decision")
            if decision == "approved":
                self.approved.add(aid)
            elif decision == "denied":
                self.denied.add(aid)
        elif kind == "tool_execution_started" and aid in self.approved:
            self.consumed.add(aid)

    def as_json(self) -> dict[str, int]:
        decided = self.approved | self.denied
        return {"requested": len(self.requested), "approved": len(self.approved),
                "denied": len(self.denied), "consumed": len(self.consumed),
                "pending": len(self.requested - decided),
                "approved_unused": len(self.approved - self.consumed)}


@dataclass
class Counts:
    """What `walj stats` counts in one pass over the records."""

    kinds: dict[str, int] = field(default_factory=dict)
    tools: dict[str, ToolStats] = field(default_factory=dict)
    open_calls: dict[str, tuple[str, float | None]] = field(default_factory=dict)  # id: tool, t
    first_t: float | None = None
    last_t: float | None = None
    first_seq: int | None = None
    undecodable: list[int] = field(default_factory=list)
    approvals: ApprovalCounts = field(default_factory=ApprovalCounts)

    def add(self, seq: int, raw: bytes) -> None:
        if self.first_seq is None:
            self.first_seq = seq
        try:
            data = decode_record(raw)
        except ValueError:
            self.undecodable.append(seq)
            data = None
        kind = data.get("kind") if isinstance(data, dict) else None
        kind = kind if isinstance(kind, str) else "-"
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if not isinstance(data, dict):
            return
        t = time_of(data.get("at"))
        if t is not None:
            self.first_t = t if self.first_t is None else min(self.first_t, t)
            self.last_t = t if self.last_t is None else max(self.last_t, t)
        _count_tool_record(kind, data, t, self.tools, self.open_calls)
        if kind in _APPROVAL_KINDS:
            self.approvals.add(kind, data)


def cmd_stats(args: argparse.Namespace) -> int:
    path: str = args.path
    names = segment_names(path)
    log_scan, records = scan(path, names, desc="counting")
    counts = Counts()
    for seq, raw in records:
        counts.add(seq, raw)
    for tool, _ in counts.open_calls.values():
        counts.tools[tool].ambiguous += 1
    first_t, last_t = counts.first_t, counts.last_t
    if first_t is None:
        first_t = log_created(path, names)
    span = None if first_t is None or last_t is None else round(last_t - first_t, 3)
    report: dict[str, Any] = {
        "schema": "walj.stats/2",
        "path": path,
        "log_id": log_scan.log_id,
        "segments": len(log_scan.segments),
        "bytes": segment_bytes(path, names),
        "records": log_scan.records,
        "first_seq": counts.first_seq,
        "last_seq": log_scan.last_seq,
        "problems": len(log_scan.problems),
        "undecodable": len(counts.undecodable),
        "time_span": {"first": first_t, "last": last_t, "seconds": span},
        "kinds": dict(sorted(counts.kinds.items(), key=lambda kv: (-kv[1], kv[0]))),
        "tools": [_tool_json(name, counts.tools[name]) for name in sorted(counts.tools)],
        "approvals": counts.approvals.as_json(),
    }
    code = EXIT_PROBLEMS if log_scan.problems or counts.undecodable else EXIT_OK
    if args.json:
        emit_json(report)
    else:
        write_lines(_stats_lines(report, counts.undecodable))
    return code


def _tool_json(name: str, st: ToolStats) -> dict[str, Any]:
    st.durations.sort()
    p50, p99 = percentile(st.durations, 0.5), percentile(st.durations, 0.99)
    return {
        "tool": name, "calls": st.calls, "ok": st.outcomes.get("ok", 0),
        "error": st.outcomes.get("error", 0), "cancelled": st.outcomes.get("cancelled", 0),
        # A guard's ToolBlocked and a dispatch the blocked journal turned away: the API
        # names both outcome `blocked`, and neither ran the tool.
        "blocked": st.outcomes.get("blocked", 0) + st.journal_blocked,
        "ambiguous": st.ambiguous, "replayed": st.replayed, "refused": st.refused,
        "error_rate": st.error_rate(),
        "p50_seconds": None if p50 is None else round(p50, 3),
        "p99_seconds": None if p99 is None else round(p99, 3),
    }


def _stats_lines(report: dict[str, Any], undecodable: list[int]) -> list[str]:
    path, span = report["path"], report["time_span"]
    lines = [
        f"{path}",
        f"  {plural(report['segments'], 'segment')}, {report['bytes']:,} bytes, "
        f"{plural(report['records'], 'record')} (seq {report['first_seq'] or 0}-"
        f"{report['last_seq']})",
        f"  from {clock(span['first'])} to {clock(span['last'])} UTC "
        f"({duration(span['seconds'])})",
    ]
    if report["problems"]:
        lines.append(f"  {plural(report['problems'], 'problem')}: run `walj verify {path}`")
    if undecodable:
        lines.append(f"  {plural(len(undecodable), 'undecodable record')}: verified, but not "
                     f"JSON (counted as '-'; first seq {undecodable[0]}): written by no walj")
    lines += ["", "Records by kind"]
    lines += table(("KIND", "RECORDS"), report["kinds"].items(), right=(1,))
    if report["tools"]:
        lines += ["", "Tools"]
        rows = [(r["tool"], r["calls"], r["ok"], r["error"], r["cancelled"], r["blocked"],
                 r["ambiguous"], r["replayed"], r["refused"],
                 "-" if r["error_rate"] is None else f"{r['error_rate']:.1%}",
                 duration(r["p50_seconds"]), duration(r["p99_seconds"])) for r in report["tools"]]
        lines += table(("TOOL", "CALLS", "OK", "ERROR", "CANCELLED", "BLOCKED", "AMBIGUOUS",
                        "REPLAYED", "REFUSED", "ERROR RATE", "P50", "P99"), rows,
                       right=range(1, 12))
    approvals = report["approvals"]
    if approvals["requested"]:
        lines += ["", "Approvals", f"  {approvals['requested']:,} requested: "
                  f"{approvals['approved']:,} approved ({approvals['consumed']:,} used, "
                  f"{approvals['approved_unused']:,} not yet), {approvals['denied']:,} denied, "
                  f"{approvals['pending']:,} pending"]
    return lines


def _tool_name(value: Any) -> str:
    """The tool as the JSON shows it: the name itself (the text view escapes it), bounded."""
    return value[:200] if isinstance(value, str) and value else "-"


_APPROVAL_KINDS = ("tool_approval_requested", "tool_approval_decided", "tool_execution_started")
# Dispatches that wrote no intent: turned away by a blocked journal, or answered by replay.
_NO_INTENT = ("tool_execution_blocked", "tool_execution_replayed", "tool_execution_refused")


def _count_tool_record(kind: str, data: dict[str, Any], t: float | None,
                       tools: dict[str, ToolStats],
                       open_calls: dict[str, tuple[str, float | None]]) -> None:
    """Count one record: every dispatch adds one call, by its intent or, when it wrote none,
    by the record that answered it."""
    execution_id = subject_of(data)
    if not isinstance(execution_id, str):
        return
    if kind == "tool_execution_started":
        tool = _tool_name(data.get("tool"))
        tools.setdefault(tool, ToolStats()).calls += 1
        open_calls[execution_id] = (tool, t)
    elif kind == "tool_execution_finished":
        entry = open_calls.pop(execution_id, None)
        if entry is None:
            return
        st = tools[entry[0]]
        outcome = opt_str(data.get("outcome")) or "unknown"
        st.outcomes[outcome] = st.outcomes.get(outcome, 0) + 1
        if t is not None and entry[1] is not None:
            st.durations.append(max(0.0, t - entry[1]))
    elif kind == "tool_execution_resolved":
        entry = open_calls.pop(execution_id, None)
        if entry is not None:
            tools[entry[0]].ambiguous += 1
    elif kind in _NO_INTENT:
        st = tools.setdefault(_tool_name(data.get("tool")), ToolStats())
        st.calls += 1
        if kind == "tool_execution_blocked":
            st.journal_blocked += 1
        elif kind == "tool_execution_replayed":
            st.replayed += 1
        else:
            st.refused += 1
