"""`walj timeline`: turns as a tree of their tool executions, approval requests and LLM calls,
with outcome and duration; ambiguous executions, blockers, and blocked, replayed and refused
dispatches are marked, each under the name the API gives its outcome."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    clock,
    duration,
    emit_json,
    int_list,
    opt_str,
    printable,
    scan,
    segment_names,
    short,
    str_list,
    write_lines,
)
from ._inspect import journal_state, snapshot
from ._model import JournalState, Recovery, subject_of, time_of, turn_number


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round(max(0.0, end - start), 3)


@dataclass
class Execution:
    execution_id: str
    tool: str | None
    call_id: str | None
    started_at: float | None
    seq: int
    finished_at: float | None = None
    outcome: str | None = None
    error: str | None = None
    ambiguous: bool = False
    error_type: str | None = None
    resolution: dict[str, Any] | None = None
    blocker: bool = False
    approval_id: str | None = None  # the approval its intent consumed

    def label(self) -> str:
        if self.outcome is not None:
            return self.outcome
        if self.resolution is not None:
            return f"resolved {self.resolution['outcome']}"
        # The blocker states: `ambiguous` once an interrupt was recorded, else `started`.
        return "ambiguous" if self.ambiguous else "started"

    def as_json(self) -> dict[str, Any]:
        return {"execution_id": self.execution_id, "tool": self.tool, "call_id": self.call_id,
                "seq": self.seq, "started_at": self.started_at, "finished_at": self.finished_at,
                "duration_seconds": _span(self.started_at, self.finished_at),
                "outcome": self.label(), "error": self.error,
                "ambiguous": self.outcome is None, "error_type": self.error_type,
                "blocker": self.blocker, "resolution": self.resolution,
                "approval_id": self.approval_id}


@dataclass
class TurnNode:
    sequence: int | None
    started_at: float | None
    completed_at: float | None = None
    completed: bool = False
    resolution: dict[str, Any] | None = None
    blocker: bool = False
    items: list[Any] = field(default_factory=list)  # Execution, dispatch dict or LLM-call dict

    def state(self) -> str:
        if self.sequence is None:
            return "outside turns"
        if self.completed:
            return "completed"
        return "resolved" if self.resolution is not None else "incomplete"


class Builder:
    """Builds the tree from decoded records in log order, each fed after `state` took it: a
    completion completes the turn the journal's own recovery paired it with."""

    def __init__(self, state: JournalState) -> None:
        self.state = state
        self.turns: dict[int | None, TurnNode] = {}
        self.order: list[int | None] = []
        self.executions: dict[str, Execution] = {}
        self.llm: dict[str, dict[str, Any]] = {}
        self.approvals: dict[str, dict[str, Any]] = {}

    def turn(self, sequence: Any, t: float | None = None) -> TurnNode:
        key = turn_number(sequence)
        node = self.turns.get(key)
        if node is None:
            node = self.turns[key] = TurnNode(key, t)
            self.order.append(key)
        return node

    def __call__(self, seq: int, data: Any) -> None:
        if not isinstance(data, dict):
            return
        kind, t, eid = data.get("kind"), time_of(data.get("at")), subject_of(data)
        if kind == "turn_started":
            self.turn(data.get("turn_sequence"), t)
        elif kind == "turn_completed":
            # Before the checkpoint a compacted log's state is taken from, the state has no
            # turns to pair with: the record's own turn number is all there is.
            paired = (turn_number(data.get("turn_sequence")) if self.state.awaiting
                      else self.state.paired_turn)
            if paired is not None and paired in self.turns:
                node = self.turns[paired]
                node.completed, node.completed_at = True, t
        elif kind == "turn_resolved":
            self.turn(data.get("turn_sequence")).resolution = _resolution(data, t)
        elif kind == "tool_execution_started" and isinstance(eid, str):
            ex = Execution(eid, opt_str(data.get("tool")), opt_str(data.get("call_id")), t, seq)
            self.executions[eid] = ex
            self.turn(data.get("turn_sequence")).items.append(ex)
            self._consumed(ex, opt_str(data.get("approval_id")))
        elif kind in ("tool_approval_requested", "tool_approval_decided"):
            self._approval(kind, seq, data, t)
        elif isinstance(kind, str) and kind in _DISPATCHES:  # a list kind is unhashable
            self.turn(data.get("turn_sequence")).items.append(_dispatch(kind, seq, data, t))
        elif kind in ("llm_call_started",) and isinstance(eid, str):
            call = {"llm_call_id": eid, "seq": seq, "model": opt_str(data.get("model")),
                    "started_at": t,
                    "finished_at": None, "duration_seconds": None, "outcome": None,
                    "pending": True}
            self.llm[eid] = call
            self.turn(data.get("turn_sequence")).items.append(call)
        elif isinstance(eid, str):
            self._settle(kind, eid, data, t)

    def _approval(self, kind: str, seq: int, data: dict[str, Any], t: float | None) -> None:
        """A request joins the turn that asked; a decision updates it (first one only)."""
        aid = opt_str(data.get("approval_id"))
        if aid is None:
            return
        if kind == "tool_approval_requested":
            if aid not in self.approvals:
                item: dict[str, Any] = {
                    "list": "approvals", "approval_id": aid, "seq": seq,
                    "tool": opt_str(data.get("tool")), "call_id": opt_str(data.get("call_id")),
                    "at": t, "status": "pending", "decision": None, "execution_id": None}
                self.approvals[aid] = item
                self.turn(data.get("turn_sequence")).items.append(item)
            return
        found = self.approvals.get(aid)
        decision = data.get("decision")
        if found is None or found["status"] != "pending" or decision not in ("approved", "denied"):
            return
        expires = time_of(data.get("expires_at"))
        found["status"] = decision
        found["decision"] = {"decision": decision, "actor": opt_str(data.get("actor")),
                            "note": opt_str(data.get("note")), "at": t, "expires_at": expires}

    def _consumed(self, ex: Execution, aid: str | None) -> None:
        item = None if aid is None else self.approvals.get(aid)
        ex.approval_id = aid
        if item is not None and item["status"] == "approved":
            item.update(status="consumed", execution_id=ex.execution_id)

    def expire(self, now: float) -> None:
        """An approved request unused past its expiry is shown `expired` (never stored)."""
        for item in self.approvals.values():
            expires = item["decision"]["expires_at"] if item["decision"] else None
            if item["status"] == "approved" and expires is not None and expires <= now:
                item["status"] = "expired"

    def _settle(self, kind: Any, eid: str, data: dict[str, Any], t: float | None) -> None:
        ex = self.executions.get(eid)
        if ex is not None:
            if kind == "tool_execution_finished" and ex.outcome is None and ex.resolution is None:
                ex.outcome, ex.finished_at = opt_str(data.get("outcome")) or "unknown", t
                ex.error = opt_str(data.get("error"))
            elif kind == "tool_execution_ambiguous":
                ex.ambiguous, ex.error_type = True, opt_str(data.get("error_type"))
            elif kind == "tool_execution_resolved" and ex.outcome is None:
                ex.resolution = _resolution(data, t)
            return
        call = self.llm.get(eid)
        if call is not None and call["pending"]:
            if kind == "llm_call_finished":
                call.update(finished_at=t, duration_seconds=_span(call["started_at"], t),
                            outcome=opt_str(data.get("outcome")), pending=False)
            elif kind == "llm_call_resolved":
                call.update(outcome=f"resolved {opt_str(data.get('outcome')) or 'unknown'}",
                            pending=False)


# Dispatches that ran no handler, by record kind: the list of the turn's JSON view that holds
# each, named as the API names a blocked or refused dispatch's outcome (a replayed one has the
# settled call's outcome and ToolResult.replayed).
_DISPATCHES = {"tool_execution_blocked": "blocked", "tool_execution_replayed": "replayed",
               "tool_execution_refused": "refused"}


def _dispatch(kind: str, seq: int, data: dict[str, Any], t: float | None) -> dict[str, Any]:
    """A blocked, replayed or refused dispatch: no handler ran for any of them."""
    eid = subject_of(data)
    item: dict[str, Any] = {
        "list": _DISPATCHES[kind], "execution_id": opt_str(eid), "seq": seq,
        "tool": opt_str(data.get("tool")), "call_id": opt_str(data.get("call_id")), "at": t}
    if kind == "tool_execution_blocked":
        item.update(outcome="blocked", blocked_by=str_list(data.get("blocked_by")),
                    blocked_by_turns=int_list(data.get("blocked_by_turns")))
    elif kind == "tool_execution_refused":
        item.update(outcome="refused", refused_reason=opt_str(data.get("refused_reason")),
                    settled_execution_id=opt_str(data.get("settled_execution_id")))
    else:
        answered = data.get("answered_from_seq")
        item.update(outcome=opt_str(data.get("outcome")),
                    answered_from_seq=answered if type(answered) is int else None)
    return item


def _resolution(data: dict[str, Any], t: float | None) -> dict[str, Any]:
    return {"outcome": opt_str(data.get("outcome", "resolved")),
            "actor": opt_str(data.get("actor")), "note": opt_str(data.get("note")), "at": t}


def _turn_json(node: TurnNode) -> dict[str, Any]:
    items: dict[str, list[Any]] = {"executions": [], "blocked": [], "replayed": [],
                                   "refused": [], "llm_calls": [], "approvals": []}
    for item in node.items:
        if isinstance(item, Execution):
            items["executions"].append(item.as_json())
        elif "list" in item:
            items[item["list"]].append({k: v for k, v in item.items() if k != "list"})
        else:
            items["llm_calls"].append(item)
    return {"turn_sequence": node.sequence, "state": node.state(),
            "started_at": node.started_at, "completed_at": node.completed_at,
            "duration_seconds": _span(node.started_at, node.completed_at),
            "blocker": node.blocker, "resolution": node.resolution, **items}


def turns_json(builder: Builder, rec: Recovery, last: int | None = None) -> list[dict[str, Any]]:
    """The turns (the `last` ones, or all) as `walj.timeline/3` lists them, each execution and
    interrupted turn that blocks now marked: `timeline` and `report` show these."""
    for b in rec.blockers:
        if b.execution_id is not None and b.execution_id in builder.executions:
            builder.executions[b.execution_id].blocker = True
        elif b.state == "interrupted_turn" and b.turn_sequence in builder.turns:
            builder.turns[b.turn_sequence].blocker = True
    builder.expire(time.time())
    order = builder.order if last is None else builder.order[-last:]
    return [_turn_json(builder.turns[key]) for key in order]


def cmd_timeline(args: argparse.Namespace) -> int:
    path: str = args.path
    if args.last is not None and args.last < 1:
        raise CliError("--last must be at least 1")
    names = segment_names(path)
    log_scan, records = scan(path, names, desc="reading")
    builder = Builder(JournalState())
    rec = snapshot(path, journal_state(path, log_scan, records, builder, builder.state))
    turns = turns_json(builder, rec, args.last)
    code = EXIT_PROBLEMS if rec.blocked or log_scan.problems else EXIT_OK
    if args.json:
        emit_json({"schema": "walj.timeline/3", "path": path, "log_id": log_scan.log_id,
                   "blocked": rec.blocked, "log_ok": not log_scan.problems, "turns": turns})
        return code
    write_lines(_render(path, turns, rec.blocked, len(log_scan.problems)))
    return code


def _render(path: str, turns: list[dict[str, Any]], blocked: bool, problems: int) -> list[str]:
    utf = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "") == "utf8"
    rows: list[tuple[str, list[str]]] = []
    for turn in turns:
        rows.append(("", [_turn_head(turn)]))
        rows += _item_rows(turn, ("├─", "└─") if utf else ("|-", "`-"))
    widths: list[int] = []
    for glyph, cells in rows:
        if glyph:
            widths += [0] * (len(cells) - len(widths))
            for i, cell in enumerate(cells):
                widths[i] = max(widths[i], len(cell))
    lines = [f"{path}: {len(turns)} turn(s)" + ("  [BLOCKED]" if blocked else "")
             + (f"  [{problems} log problem(s): walj verify]" if problems else "")]
    for glyph, cells in rows:
        padded = [c.ljust(widths[i]) for i, c in enumerate(cells)]
        lines.append(f"  {glyph} " + "  ".join(padded).rstrip() if glyph else cells[0])
    return lines


def _turn_head(turn: dict[str, Any]) -> str:
    head = f"turn {turn['turn_sequence']}" if turn["turn_sequence"] is not None else "(no turn)"
    marks = "  INTERRUPTED-TURN BLOCKER" if turn["blocker"] else ""
    res = turn["resolution"]
    settled = f"  resolved by {res['actor']}: {short(res['note'], 60)}" if res else ""
    state = turn["state"].upper() if turn["state"] == "incomplete" else turn["state"]
    return (f"{head}  {state}  {clock(turn['started_at'])}  "
            f"{duration(turn['duration_seconds'])}{marks}{settled}")


def _item_rows(turn: dict[str, Any], glyphs: tuple[str, str]) -> list[tuple[str, list[str]]]:
    """A turn's items in log order, each a row of cells under its tree glyph."""
    items = ([("x", e) for e in turn["executions"]] + [("b", b) for b in turn["blocked"]]
             + [("p", p) for p in turn["replayed"]] + [("r", r) for r in turn["refused"]]
             + [("l", c) for c in turn["llm_calls"]] + [("a", a) for a in turn["approvals"]])
    items.sort(key=lambda kv: int(kv[1]["seq"]))
    return [(glyphs[i == len(items) - 1], [printable(c) for c in _item_cells(kind, item)])
            for i, (kind, item) in enumerate(items)]


def _item_cells(kind: str, item: dict[str, Any]) -> list[str]:
    if kind == "x":
        marks = []
        if item["ambiguous"]:
            marks.append("AMBIGUOUS")
        if item["blocker"]:
            marks.append("BLOCKER")
        detail = ""
        if item["resolution"] is not None:
            r = item["resolution"]
            detail = f"by {r['actor']}: {short(r['note'], 50)}"
        elif item["error"]:
            detail = short(item["error"], 60)
        elif item["error_type"]:
            detail = f"interrupted by {item['error_type']}"
        return [str(item["tool"]), str(item["call_id"]), item["outcome"],
                duration(item["duration_seconds"]), " ".join(marks),
                f"exec {str(item['execution_id'])[:12]}", detail]
    if kind in ("b", "p", "r"):
        return _dispatch_cells(kind, item)
    if kind == "a":
        return _approval_cells(item)
    outcome = "pending" if item["pending"] else str(item["outcome"])
    return [f"llm {item['model'] or '-'}", "-", outcome, duration(item["duration_seconds"]),
            "PENDING" if item["pending"] else "", f"llm {str(item['llm_call_id'])[:12]}", ""]


def _dispatch_cells(kind: str, item: dict[str, Any]) -> list[str]:
    """A row for a dispatch that ran no handler. A blocked or refused one is marked with its
    outcome's own name (the API's, the record kind's), a replayed one REPLAYED."""
    mark = "REPLAYED" if kind == "p" else str(item["outcome"]).upper()
    if kind == "b":
        count = len(item["blocked_by"]) + len(item["blocked_by_turns"])
        detail = f"the journal was blocked by {count} blocker(s)"
    elif kind == "r":
        detail = str(item["refused_reason"])
    else:
        detail = f"answered from record {item['answered_from_seq']}"
    return [str(item["tool"]), str(item["call_id"]), str(item["outcome"]), "-", mark,
            f"exec {str(item['execution_id'])[:12]}", f"{detail}; nothing ran"]


_APPROVAL_MARKS = {"pending": "AWAITING-APPROVAL", "approved": "APPROVED", "denied": "DENIED",
                   "expired": "APPROVAL-EXPIRED", "consumed": "APPROVED"}


def _approval_cells(item: dict[str, Any]) -> list[str]:
    """A row for an approval request: what was decided, by whom, and which execution used it."""
    decision = item["decision"]
    detail = "awaiting a person: walj approve / walj deny" if decision is None else (
        f"{decision['decision']} by {decision['actor']}" + (
            f": {short(decision['note'], 50)}" if decision["note"] else ""))
    if item["execution_id"] is not None:
        detail += f"; used by exec {str(item['execution_id'])[:12]}"
    return [str(item["tool"]), str(item["call_id"]), f"approval {item['status']}", "-",
            _APPROVAL_MARKS.get(item["status"], ""), f"apv {str(item['approval_id'])[4:16]}",
            detail]
