"""Interrupts at every step: KeyboardInterrupt and SystemExit raised at every line of walj's own
code on the path of a log or journal operation (and, for async journal code, the task cancelled
there and at every event-loop step), one trial per line event, with the invariants checked after
each (see interrupts.py). A black-box complement sends real SIGINTs to a child process."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from budget import SCALE, SEED, TALLY, rng_for, scaled
from interrupts import (
    INVARIANTS,
    TRIAL_TIMEOUT,
    WALJ_ROOT,
    Ack,
    Helpers,
    Injection,
    JournalAcks,
    JournalFollowUps,
    LogFollowUps,
    Report,
    Result,
    Scenario,
    Stuck,
    Violation,
    check_journal_files,
    check_log_files,
    drive,
    run_loop,
    where,
)

import walj
from walj.journal import _requests
from walj.journal._requests import request_fields
from walj.log import post_request


@pytest.fixture(scope="module", autouse=True)
def _watcher_waits() -> Iterator[None]:
    """The process-wide watcher thread would race the traced pick-up for the same request (an
    interrupt lands on the main thread, never on it): while this module runs it waits, so each
    trial is the same. Afterwards the interval is restored and the sleeping watcher woken, so
    the tests that run next in this process have a watcher again."""
    before = _requests.WATCH_INTERVAL
    _requests.WATCH_INTERVAL = 3600.0
    yield
    _requests.WATCH_INTERVAL = before
    _requests._watcher.wake.set()
    _requests._watcher.wake.clear()

MODES = ("always", "batch", "interval", "never")
# An approval's records take the journal's one write path, which every sync mode's scenarios
# above cover: the default run interrupts them in two modes, a long run (WALJ_TORTURE) in all.
APPROVAL_MODES = MODES if SCALE >= 2 else ("always", "never")
SEGMENT_BYTES = 1024
EXCEPTIONS: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit)
# Operations up to this many walj line events get a trial at every one; longer ones a sample
# holding every distinct line (then one trial aimed at each line no trial landed on).
FULL_LIMIT = scaled(90)
BOTH_EXCEPTIONS = SCALE >= 2  # long runs: KeyboardInterrupt and SystemExit at every event

RESULTS: list[Result] = []
_POINTS: set[tuple[str, int]] = set()
_OPERATIONS: set[str] = set()  # the operations interrupted (a scenario in any sync mode)
_SHARED: dict[str, dict[tuple[str, bytes], str]] = {}
_SCRATCH: list[Path] = []
# The default run's budget counts on two cores: one trial process per core, up to two
# (WALJ_INTERRUPTS_JOBS=N for N, 0 to run the trials in the test process itself).
_JOBS = os.environ.get("WALJ_INTERRUPTS_JOBS")
HELPERS = Helpers(int(_JOBS) if _JOBS else min(2, os.cpu_count() or 1))


def options(mode: str) -> dict[str, Any]:
    """A sync mode, or "sync+commit" for a log whose syncs go to the commit service."""
    sync, _, commit = mode.partition("+")
    extra: dict[str, Any] = {"sync_interval_ms": 1} if sync == "interval" else {}
    if commit:
        extra["commit"] = commit
    return {"sync": sync, "segment_bytes": SEGMENT_BYTES, **extra}


def scratch(tmp_path: Path) -> Path:
    """Where the trials run. Thousands of trials each fsync fresh files; on a disk that costs
    tens of ms a trial, in RAM a fraction of one, and interrupts do not depend on the medium.
    So: WALJ_INTERRUPTS_DIR if set, else a RAM-backed folder where there is one (/dev/shm on
    Linux), else pytest's tmp_path. Trial folders with a violation are copied to tmp_path."""
    root = os.environ.get("WALJ_INTERRUPTS_DIR") or (
        "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else "")
    if not root:
        return tmp_path / "trials"
    path = Path(tempfile.mkdtemp(prefix="walj-interrupts-", dir=root))
    _SCRATCH.append(path)
    return path


def run_scenario(scenario: Scenario, tmp_path: Path, group: str | None = None) -> Result:
    """Drive one scenario; `group` names scenarios that start from the same prepared state, so
    a trial identical to one of an earlier scenario of the group is not run again."""
    rng = rng_for(f"interrupts:{scenario.name}:{scenario.mode}")
    started = time.monotonic()
    workdir = scratch(tmp_path)
    result = drive(scenario, workdir, rng, full_limit=FULL_LIMIT, exceptions=EXCEPTIONS,
                   both=BOTH_EXCEPTIONS,
                   shared=_SHARED.setdefault(group, {}) if group else None,
                   helpers=HELPERS)
    RESULTS.append(result)
    new = result.interrupted - _POINTS
    _POINTS.update(new)
    TALLY.add(trials_interrupts=result.trials, interrupt_points=len(new), faults=result.fired,
              checked=result.checked, lost=result.lost,
              interrupt_operations=int(result.scenario not in _OPERATIONS))
    _OPERATIONS.add(result.scenario)
    for kept in result.kept[:5]:
        if not kept.is_relative_to(tmp_path):
            shutil.copytree(kept, tmp_path / "violations" / kept.name, symlinks=True)
    if result.violations:
        pytest.fail(f"{result.summary()} in {time.monotonic() - started:.1f} s\n"
                    + format_violations(result.violations), pytrace=False)
    return result


_IDS = re.compile(r"\b(?=[0-9]*[a-f])[0-9a-f]{8,32}\b")  # execution ids, whole or cut


def format_violations(violations: list[Violation], limit: int = 25) -> str:
    """Violations grouped by invariant and message (ids elided), each with where it landed."""
    groups: dict[tuple[str, str], list[Violation]] = {}
    for v in violations:
        message = _IDS.sub("<id>", v.message.split("\n")[0])[:200]
        groups.setdefault((v.invariant, message), []).append(v)
    lines = [f"{len(violations)} invariant violation(s) in {len(groups)} group(s):"]
    for (invariant, message), vs in sorted(groups.items())[:limit]:
        points = sorted({v.point for v in vs})
        shown = "; ".join(points[:8]) + (f"; ... {len(points) - 8} more" if len(points) > 8 else "")
        injected = ", ".join(sorted({v.injected for v in vs}))
        lines.append(f"  [{invariant}: {INVARIANTS[invariant]}] x{len(vs)} ({injected})\n"
                     f"    {message}\n    at: {shown}")
        detail = vs[0].message.split("\n", 1)
        if len(detail) > 1:
            lines.append("    " + detail[1].replace("\n", "\n    "))
    if len(groups) > limit:
        lines.append(f"  ... and {len(groups) - limit} more group(s)")
    return "\n".join(lines)


@pytest.fixture(scope="module", autouse=True)
def _coverage_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Writes walj-interrupts.json beside the suite summary: coverage per operation family and
    mode, and every violation."""
    yield
    HELPERS.close()
    for path in _SCRATCH:
        shutil.rmtree(path, ignore_errors=True)
    if not RESULTS:
        return
    families: dict[str, set[tuple[str, int]]] = {}
    for r in RESULTS:
        families.setdefault(r.scenario, set()).update(r.covered)
    out = {
        "seed": SEED,
        "interrupt_points": len(_POINTS),
        "families": {name: len(points) for name, points in sorted(families.items())},
        "scenarios": [
            {"scenario": r.scenario, "mode": r.mode, "line_events": r.events,
             "loop_steps": r.steps, "distinct_lines": len(r.reached),
             "interrupted_lines": len(r.interrupted),
             "covered_by_identical_trials": len(r.shared - r.interrupted),
             "trials": r.trials,
             "not_covered": sorted(where(p) for p in r.reached - r.covered)}
            for r in RESULTS
        ],
        "violations": [v._asdict() for r in RESULTS for v in r.violations],
    }
    path = tmp_path_factory.getbasetemp() / "walj-interrupts.json"
    path.write_text(json.dumps(out, indent=1) + "\n")


def classify(inj: Injection, rep: Report, exc: BaseException | None) -> None:
    """Invariant 0: the injected interrupt came out of the operation, unchanged."""
    if exc is None:
        if inj.fired:
            rep.fail("0", f"the operation returned normally: the {inj.name} was swallowed")
    elif not inj.fired or not inj.matches(exc):
        rep.fail("0", f"the operation raised {type(exc).__name__}: {exc}"[:300]
                      + (f" instead of the injected {inj.name}" if inj.fired else ""))


# --- the log -----------------------------------------------------------------------------------

BASE_RECORDS = 9


def base_record(i: int) -> dict[str, Any]:
    return {"i": i, "pad": "b" * 60}


TORN = b'{"xxh64":"0123456789abcdef","seq":10,"data":{"i":9,"pa'


class LogScenario(Scenario):
    family = "log"

    def __init__(self, mode: str, op: str) -> None:
        super().__init__(mode)
        self.op = op
        self.name = f"log.{op}"

    def build(self, base: Path) -> None:
        path = base / "log"
        with walj.Log.open(path, **options(self.mode)) as log:
            for i in range(BASE_RECORDS):
                log.append(base_record(i))
        segments = sorted(path.glob("seg-*.jsonl"))
        assert len(segments) == 2 and segments[-1].stat().st_size < 600, "rotate once first"
        if self.op == "open_torn":
            with open(segments[-1], "ab") as f:
                f.write(TORN)

    def trial(self, path: Path, inj: Injection, rep: Report) -> None:
        logdir = path / "log"
        acked: list[Ack] = [(i + 1, base_record(i)) for i in range(BASE_RECORDS)]
        attempted: list[dict[str, Any]] = []
        log: walj.Log | None = None
        if not self.op.startswith("open"):
            log = walj.Log.open(logdir, **options(self.mode))
            if self.op in ("sync", "close", "close_seal"):  # something for them to sync
                for n in range(2):
                    data = {"unsynced": n}
                    acked.append((log.append(data), data))
        rep.stage = f"the interrupted {self.op}"
        try:
            log = self.operate(log, logdir, inj, acked, attempted)
        except BaseException as exc:  # noqa: B036 - the injected interrupt, checked here
            classify(inj, rep, exc)
        else:
            classify(inj, rep, None)
        if log is None:  # an interrupted open: open again
            rep.stage = "open after the interrupted open"
            try:
                log = walj.Log.open(logdir, **options(self.mode))
            except (walj.LockedError, walj.CorruptionError) as exc:
                rep.fail("4", f"open after the interrupted open refused: {type(exc).__name__}: "
                              f"{exc}"[:300])
        if log is not None:
            LogFollowUps(rep, acked, attempted,
                         closing=self.op in ("close", "close_seal")).run(log, logdir)
        check_log_files(logdir, rep, acked, attempted,
                        lambda: walj.Log.open(logdir, **options(self.mode)))

    def operate(self, log: walj.Log | None, logdir: Path, inj: Injection, acked: list[Ack],
                attempted: list[dict[str, Any]]) -> walj.Log | None:
        op = self.op
        if op.startswith("open"):
            return inj.call(lambda: walj.Log.open(logdir, **options(self.mode)))  # type: ignore[no-any-return]
        assert log is not None
        if op in ("append", "append_durable", "append_rotate"):
            data = {"op": op, "pad": "r" * (900 if op == "append_rotate" else 10)}
            attempted.append(data)
            seq = inj.call(lambda: log.append(data, durable=op == "append_durable"))
            acked.append((seq, data))
        elif op == "append_many":
            datas = [{"op": op, "i": i} for i in range(3)]
            attempted.extend(datas)
            seqs = inj.call(lambda: log.append_many(datas))
            acked.extend(zip(seqs, datas, strict=True))
        elif op == "sync":
            inj.call(log.sync)
        elif op == "close":
            inj.call(log.close)
        elif op == "close_seal":  # seals the active segment and opens no next one
            inj.call(lambda: log.close(seal=True))
        return log


LOG_OPS = ("append", "append_durable", "append_many", "append_rotate", "sync", "close",
           "close_seal", "open", "open_torn")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", LOG_OPS)
def test_interrupt_log(tmp_path: Path, op: str, mode: str) -> None:
    group = (f"log-open:{op}" if op.startswith("open") else  # the scan is the same in any mode
             f"log-append:{mode}" if op.startswith("append") and op != "append_many" else None)
    run_scenario(LogScenario(mode, op), tmp_path, group)


# The commit service: its waits, its hand-offs, an interrupt while it syncs.
SERVICE_MODES = ("batch+files", "batch+syncfs", "always+files")
SERVICE_OPS = ("append", "append_durable", "sync", "close")


@pytest.mark.parametrize("mode", SERVICE_MODES)
@pytest.mark.parametrize("op", SERVICE_OPS)
def test_interrupt_log_commit_service(tmp_path: Path, op: str, mode: str) -> None:
    run_scenario(LogScenario(mode, op), tmp_path)


# --- the journal -------------------------------------------------------------------------------


def ok(x: int) -> dict[str, int]:
    return {"x": x}


def err(x: int) -> None:
    raise RuntimeError(f"tool failed on {x}")


def cancelled(x: int) -> None:
    raise walj.ToolCancelled("did nothing")


async def aok(x: int) -> dict[str, int]:
    await asyncio.sleep(0)
    return {"x": x}


async def aerr(x: int) -> None:
    await asyncio.sleep(0)
    raise RuntimeError(f"tool failed on {x}")


async def acancelled(x: int) -> None:
    await asyncio.sleep(0)
    raise walj.ToolCancelled("did nothing")


def _reconcile_fails(blocker: walj.Blocker) -> str | None:
    raise ConnectionError("the outbox cannot be reached")


TOOLS: dict[str, Any] = {"ok": ok, "err": err, "cancelled": cancelled, "aok": aok, "aerr": aerr,
                         "acancelled": acancelled, "gated": walj.Tool(ok, approval=True)}
# The call that needs approval in the approval scenarios, and the bases that ask for it.
GATED = {"tool": "gated", "arguments": {"x": 1}, "call_id": "g1"}
ASKING = ("pending", "approved", "decided")
OPEN_TOOLS: dict[str, Any] = {
    **TOOLS,
    "assume": walj.Tool(ok, on_ambiguous="assume_done"),
    "recon": walj.Tool(ok, reconcile=lambda b: "not_performed"),
    "rnone": walj.Tool(ok, reconcile=lambda b: None),
    "rfail": walj.Tool(ok, reconcile=_reconcile_fails),
    "rerun": walj.Tool(ok, on_ambiguous="rerun"),
}


def _interrupting(x: int) -> None:
    raise KeyboardInterrupt


def build_journal(path: Path, mode: str, kind: str) -> list[str]:
    """The prepared journal: "fresh" (one completed turn), "blocked" (one ambiguous execution)
    or "many" (four ambiguous executions of tools with a policy or a reconcile hook that
    settles, declines or fails, left by concurrent adispatch calls that were cancelled), or
    "settled" (one ambiguous execution, and call "c1" of tool ok, {"x": 1}, settled with its
    output stored: a dispatch of it again is replayed, before the blocked check), or
    "compactable" (settled, then a checkpoint and a turn after it: segments to drop), or
    "pending" / "approved" (one completed turn, and the GATED call's approval requested, or
    requested and approved), or "decided" (approved, and two more calls' requests, one
    pending and one denied). Returns the blockers' execution ids."""
    with walj.ToolJournal.open(path, store_outputs=kind in ("settled", "compactable"),
                               tools=TOOLS if kind in ASKING else None,
                               **options(mode)) as journal:
        with journal.turn() as turn:
            turn.dispatch("ok", {"x": 0}, handler=ok)
        if kind in ASKING:
            with journal.turn() as turn:
                asked = [turn.dispatch(GATED["tool"], GATED["arguments"], call_id=call_id)
                         for call_id in (GATED["call_id"], "g2", "g3")[:3 if kind == "decided"
                                                                         else 1]]
            assert all(a.outcome == "awaiting_approval" and a.approval_id for a in asked), asked
            if kind != "pending":
                journal.approve(asked[0].approval_id, actor="ann", note="checked")
            if kind == "decided":
                journal.deny(asked[2].approval_id, actor="ann", note="no")
        if kind in ("settled", "compactable"):
            with journal.turn() as turn:
                turn.dispatch("ok", {"x": 1}, handler=ok, call_id="c1")
        if kind in ("blocked", "settled", "compactable"):
            try:
                with journal.turn() as turn:
                    turn.dispatch("stay", {"x": 1}, handler=_interrupting)
            except KeyboardInterrupt:
                pass
        if kind == "compactable":
            journal.checkpoint()
            with journal.turn() as turn:
                turn.dispatch("ok", {"x": 2}, handler=ok, call_id="c2")
        elif kind == "many":
            asyncio.run(_cancelled_together(journal, ["assume", "recon", "rnone", "rfail"]))
    with walj.ToolJournal.open(path, recovery="salvage") as journal:
        blockers = journal.recovery.blockers
    want = {"fresh": 0, "blocked": 1, "many": 4, "settled": 1, "compactable": 1}.get(kind, 0)
    assert len(blockers) == want and all(b.state == "ambiguous" for b in blockers), \
        f"could not prepare the {kind} journal: {blockers}"
    return [b.execution_id for b in blockers if b.execution_id]


async def _cancelled_together(journal: walj.ToolJournal, names: list[str]) -> None:
    entered: list[int] = []
    gate = asyncio.Event()

    async def hold(x: int) -> None:
        entered.append(x)
        await gate.wait()

    async with journal.turn() as turn:
        tasks = [asyncio.create_task(turn.adispatch(name, {"x": i}, handler=hold))
                 for i, name in enumerate(names)]
        while len(entered) < len(names):
            await asyncio.sleep(0.001)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def span_observers() -> list[Any]:
    """walj's OpenTelemetry observer on an SDK provider that keeps its spans in memory: so an
    interrupt lands on every line of the hook and of the observer too."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from walj.integrations.otel import SpanObserver

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    return [SpanObserver(provider)]


class JournalScenario(Scenario):
    family = "journal"
    BASES = {"open_settle": "many", "resolve": "blocked", "dispatch_refused": "blocked",
             "dispatch_replayed": "settled", "dispatch_replay_refused": "settled",
             "adispatch_replayed": "settled", "checkpoint": "settled",
             "compact": "compactable", "request_apply": "blocked",
             "request_refused": "blocked", "open_request": "blocked",
             "dispatch_approved": "approved", "decide_approved": "pending",
             "decide_denied": "pending", "compact_approvals": "decided"}
    BASES.update({f"{op}_observed": base for op, base in list(BASES.items())})

    def __init__(self, mode: str, op: str) -> None:
        super().__init__(mode)
        self.op = op
        self.name = f"journal.{op}"
        self.is_async = op.startswith("a")
        self.blockers: list[str] = []
        self.approval_id = ""  # the GATED call's request, in the approval scenarios' bases

    def build(self, base: Path) -> None:
        self.blockers = build_journal(base / "journal", self.mode,
                                      self.BASES.get(self.op, "fresh"))
        if self.op in APPROVAL_OPS:
            with walj.ToolJournal.open(base / "journal") as journal:
                known = (*journal.recovery.approvals, *journal.recovery.approved)
            self.approval_id = known[0].approval_id if known else ""
        if self.op == "open_request":  # left while no one held the session
            post_request(base / "journal", request_fields(
                "resolve", self.blockers[0], "not_performed", "seen", "ann", 1.0))

    def trial(self, path: Path, inj: Injection, rep: Report) -> None:
        jdir = path / "journal"
        acks = JournalAcks()
        tools = OPEN_TOOLS if self.op == "open_settle" else TOOLS
        holder: list[walj.ToolJournal | None] = [None]
        if self.op not in ("open_settle", "open_request"):
            watching = span_observers() if self.op.endswith("_observed") else []
            holder[0] = walj.ToolJournal.open(jdir, tools=tools, observers=watching,
                                              **options(self.mode))
        rep.stage = f"the interrupted {self.op}"
        try:
            if self.is_async:
                journal = holder[0]
                assert journal is not None
                run_loop(lambda: self.aoperate(journal, inj, acks), TRIAL_TIMEOUT)
            else:
                self.operate(holder, jdir, inj, acks, tools)
        except Stuck as exc:
            rep.fail("1", str(exc))
        except BaseException as exc:  # noqa: B036 - the injected interrupt, checked here
            classify(inj, rep, exc)
        else:
            classify(inj, rep, None)
        journal = holder[0]
        if journal is None:
            rep.stage = "open after the interrupted open"
            try:
                journal = walj.ToolJournal.open(jdir, tools=tools, **options(self.mode))
            except (walj.LockedError, walj.CorruptionError) as exc:
                rep.fail("4", f"open after the interrupted open refused: {type(exc).__name__}: "
                              f"{exc}"[:300])
        if journal is not None:
            JournalFollowUps(rep, acks, lenient=self.is_async, closing=self.op == "close",
                             gated=GATED if self.op in APPROVAL_OPS else None
                             ).run(journal, jdir)
        check_journal_files(jdir, rep, acks)

    def operate(self, holder: list[walj.ToolJournal | None], jdir: Path, inj: Injection,
                acks: JournalAcks, tools: dict[str, Any]) -> None:
        op = self.op.removesuffix("_observed")
        if op in ("open_settle", "open_request"):
            holder[0] = inj.call(lambda: walj.ToolJournal.open(jdir, tools=tools,
                                                               **options(self.mode)))
            if op == "open_request":  # the open applied the request left for it
                acks.resolved.add(self.blockers[0])
            return
        journal = holder[0]
        assert journal is not None
        if op == "close":
            with journal.turn() as turn:  # something for close to sync in every mode
                acks.turns.add(turn.sequence)
                acks.result(turn.dispatch("ok", {"x": 1}))
            acks.completed.add(turn.sequence)
            inj.call(journal.close)
        elif op == "checkpoint":
            inj.call(journal.checkpoint)
        elif op == "compact":
            inj.call(lambda: journal.compact(keep_turns=1))
        elif op in ("request_apply", "request_refused"):
            # Another process's request; the pick-up before is_blocked answers applies it.
            target = self.blockers[0] if op == "request_apply" else "0" * 32
            acks.requests.add(post_request(jdir, request_fields(
                "resolve", target, "not_performed", "seen", "ann", 1.0)))
            inj.call(journal.is_blocked)
            if op == "request_apply":
                acks.resolved.add(target)
        elif op in APPROVAL_OPS:
            self.operate_approval(op, journal, inj, acks)
        elif op == "resolve":
            eid = self.blockers[0]
            inj.call(lambda: journal.resolve(eid, "succeeded", actor="ann", note="seen"))
            acks.resolved.add(eid)
        elif op == "turn_enter":
            turn = journal.turn()
            inj.call(turn.__enter__)
            acks.turns.add(turn.sequence)
            turn.__exit__(None, None, None)
            acks.completed.add(turn.sequence)
        elif op == "turn_exit":
            turn = journal.turn()
            turn.__enter__()
            acks.turns.add(turn.sequence)
            acks.result(turn.dispatch("ok", {"x": 1}))
            inj.call(lambda: turn.__exit__(None, None, None))
            acks.completed.add(turn.sequence)
        elif op in ("dispatch_replayed", "dispatch_replay_refused"):
            arguments = {"x": 1 if op == "dispatch_replayed" else 2}
            with journal.turn() as turn:
                acks.turns.add(turn.sequence)
                acks.result(inj.call(lambda: turn.dispatch("ok", arguments, call_id="c1")))
            acks.completed.add(turn.sequence)
        else:
            tool = {"dispatch_ok": "ok", "dispatch_error": "err",
                    "dispatch_cancelled": "cancelled", "dispatch_refused": "ok"}[op]
            with journal.turn() as turn:
                acks.turns.add(turn.sequence)
                acks.result(inj.call(lambda: turn.dispatch(tool, {"x": 1})))
            acks.completed.add(turn.sequence)

    def operate_approval(self, op: str, journal: walj.ToolJournal, inj: Injection,
                         acks: JournalAcks) -> None:
        """A dispatch that asks for approval, or runs on one; an approval or a denial."""
        aid = self.approval_id
        if op == "compact_approvals":  # its checkpoint must carry what the dropped ones said
            inj.call(lambda: journal.compact(keep_turns=0))
            return
        if op in ("decide_approved", "decide_denied"):
            decide = journal.approve if op == "decide_approved" else journal.deny
            inj.call(lambda: decide(aid, actor="ann", note="checked"))
            acks.approvals[aid] = op.removeprefix("decide_")
            return
        with journal.turn() as turn:
            acks.turns.add(turn.sequence)
            acks.result(inj.call(lambda: turn.dispatch(GATED["tool"], GATED["arguments"],
                                                       call_id=GATED["call_id"])))
        acks.completed.add(turn.sequence)

    async def aoperate(self, journal: walj.ToolJournal, inj: Injection,
                       acks: JournalAcks) -> None:
        op = self.op.removesuffix("_observed")
        if op == "aturn_enter":
            turn = journal.turn()
            await inj.acall(turn.__aenter__)
            acks.turns.add(turn.sequence)
            try:  # what `async with` does: a cancel that lands in the body still exits the turn
                await asyncio.sleep(0)
            except BaseException as exc:
                await turn.__aexit__(type(exc), exc, exc.__traceback__)
                raise
            await turn.__aexit__(None, None, None)
            acks.completed.add(turn.sequence)
        elif op == "aturn_exit":
            turn = journal.turn()
            await turn.__aenter__()
            acks.turns.add(turn.sequence)
            acks.result(await turn.adispatch("aok", {"x": 1}))
            await inj.acall(lambda: turn.__aexit__(None, None, None))
            acks.completed.add(turn.sequence)
            await asyncio.sleep(0)
        else:
            tool = {"adispatch_ok": "aok", "adispatch_error": "aerr",
                    "adispatch_cancelled": "acancelled", "adispatch_sync": "ok",
                    "adispatch_replayed": "ok"}[op]
            call_id = "c1" if op == "adispatch_replayed" else None
            async with journal.turn() as turn:
                acks.turns.add(turn.sequence)
                acks.result(await inj.acall(lambda: turn.adispatch(tool, {"x": 1},
                                                                   call_id=call_id)))
                await asyncio.sleep(0)  # a cancel asked for in the op's last step lands here
            acks.completed.add(turn.sequence)


JOURNAL_OPS = ("turn_enter", "turn_exit", "dispatch_ok", "dispatch_error", "dispatch_cancelled",
               "dispatch_refused", "resolve", "open_settle", "close", "dispatch_replayed",
               "dispatch_replay_refused", "checkpoint", "compact", "request_apply",
               "request_refused", "open_request")
# Dispatch of a call that needs approval (asking for it; running on it), approve and deny, and
# a compaction whose checkpoint carries the pending, approved and denied requests it drops.
APPROVAL_OPS = ("dispatch_approval", "dispatch_approved", "decide_approved", "decide_denied",
                "compact_approvals")
ASYNC_OPS = ("aturn_enter", "aturn_exit", "adispatch_ok", "adispatch_error",
             "adispatch_cancelled", "adispatch_sync", "adispatch_replayed")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", JOURNAL_OPS)
def test_interrupt_journal(tmp_path: Path, op: str, mode: str) -> None:
    group = ("open_settle" if op == "open_settle" else
             f"dispatch:{mode}" if op in ("dispatch_ok", "dispatch_error", "dispatch_cancelled")
             else None)
    run_scenario(JournalScenario(mode, op), tmp_path, group)


@pytest.mark.parametrize(("op", "mode"), [
    (op, mode) for op in APPROVAL_OPS for mode in APPROVAL_MODES
    # A compaction has a thousand distinct lines: one sync mode by default.
    if op != "compact_approvals" or mode == "never" or SCALE >= 2])
def test_interrupt_journal_approvals(tmp_path: Path, op: str, mode: str) -> None:
    run_scenario(JournalScenario(mode, op), tmp_path)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", ASYNC_OPS)
def test_interrupt_journal_async(tmp_path: Path, op: str, mode: str) -> None:
    # Ops from the same prepared journal share trials; a replay starts from its own.
    group = (f"adispatch:{mode}" if op.startswith("adispatch") and op != "adispatch_replayed"
             else None)
    run_scenario(JournalScenario(mode, op), tmp_path, group)


OBSERVED_OPS = ("dispatch_ok_observed", "dispatch_error_observed",
                "dispatch_refused_observed", "resolve_observed", "adispatch_ok_observed",
                "adispatch_error_observed", "adispatch_replayed_observed",
                "dispatch_replayed_observed", "dispatch_replay_refused_observed")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("op", OBSERVED_OPS)
def test_interrupt_journal_observed(tmp_path: Path, op: str) -> None:
    """With the OpenTelemetry observer: the hook's lines and the observer's are interrupted
    too, and every invariant holds as without it; the replay answers (which run inside the
    dispatch's interrupt handling with the hook) included. One sync mode: the hook does no
    I/O."""
    pytest.importorskip("opentelemetry.sdk")
    run_scenario(JournalScenario("always", op), tmp_path)


# --- the black box: real SIGINTs to a child process ---------------------------------------------

SIGINT_ROUNDS = scaled(2)  # children per sync mode, one after the other on the same files
SIGINT_PER_CHILD = 5
CHILD = Path(__file__).resolve().parent / "child_sigint.py"
# The child imports the walj this process imports (a checkout, or a copy on PYTHONPATH).
CHILD_ENV = {**os.environ,
             "PYTHONPATH": os.pathsep.join([WALJ_ROOT, *filter(None, [os.environ.get(
                 "PYTHONPATH")])])}


class ChildRecords:
    """What may stand in the log unacknowledged: a child's {"r": round, "n": n} whose call was
    interrupted, and the record check_log_files appends after its reopen."""

    def __contains__(self, data: object) -> bool:
        return isinstance(data, dict) and (set(data) == {"r", "n"} or data == {"reopened": True})


class Hang(Exception):
    pass


def run_sigint_child(base: Path, mode: str, rnd: int,
                     rng: random.Random) -> tuple[list[str], Violation | None]:
    """One child: wait until it is ready, then SIGINT it SIGINT_PER_CHILD times at random
    moments, each after it said it recovered from the one before. Returns its oracle lines,
    and what went wrong (a check the child failed, a hang, a crash), if anything."""
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), str(base), mode, str(SEED), str(rnd),
         str(SIGINT_PER_CHILD), str(write_fd)],
        env=CHILD_ENV, pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write_fd)
    lines: list[str] = []
    arrived = threading.Condition()

    def drain() -> None:
        pending = b""
        while True:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            pending += chunk
            *done, pending = pending.split(b"\n")
            with arrived:
                lines.extend(line.decode() for line in done)
                arrived.notify_all()
        with arrived:
            lines.append("EOF")
            arrived.notify_all()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    seen = [0]

    def wait_for(tags: set[str], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with arrived:
            while True:
                while seen[0] < len(lines):
                    line = lines[seen[0]]
                    seen[0] += 1
                    if line.split(" ", 1)[0] in tags or line == "EOF":
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Hang(f"no {'/'.join(sorted(tags))} line within {timeout:.0f} s")
                arrived.wait(left)

    def landed_last() -> str:
        marks = [line for line in lines if line.startswith("I ")]
        return where_text(marks[-1][2:]) if marks else "before any interrupt"

    problem: tuple[str, str] | None = None
    swallowed: list[str] = []
    dropped = 0  # SIGINTs the child dropped, by its last V line
    mark = 0  # oracle lines read before the SIGINT under way
    try:
        if wait_for({"O"}, 60) != "O":
            problem = ("4", "the child died before it was ready")
        for k in range(1, SIGINT_PER_CHILD + 1):
            if problem:
                break
            time.sleep(rng.uniform(0.0, 0.02))
            os.kill(proc.pid, signal.SIGINT)
            try:
                line = wait_for({"V", "E"}, 3)
            except Hang:
                # Nothing came back: either the child hangs, or the KeyboardInterrupt never
                # reached its top level (swallowed on the way). A second SIGINT tells which.
                raised = [x[2:] for x in lines[mark:] if x.startswith("S ")]
                os.kill(proc.pid, signal.SIGINT)
                line = wait_for({"V", "E"}, 20)
                if line.startswith("V ") and int(line.split()[2]) > dropped:
                    pass  # it came before the child went back to work: dropped, by design
                elif not raised or raised[0] == "-":
                    pass  # raised outside walj (a weakref callback, say): not walj's to keep
                else:
                    swallowed.append(
                        f"SIGINT {k} was swallowed: the KeyboardInterrupt raised at "
                        f"{where_text(raised[0]) if raised else '?'} never reached the child's "
                        "top level (a second SIGINT got through)")
            if line.startswith("V "):
                dropped = int(line.split()[2])
            mark = len(lines)
            if line.startswith("E "):
                invariant, _, message = line[2:].partition(" ")
                problem = (invariant.strip("[]"), f"after SIGINT {k}: {message}")
            elif not line.startswith("V"):
                problem = ("2", f"the child died after SIGINT {k}")
        if not problem and wait_for({"Q"}, 60) != "Q":
            problem = ("2", "the child died before closing")
        if not problem:
            proc.wait(timeout=60)
    except Hang as exc:
        os.kill(proc.pid, signal.SIGUSR1)  # faulthandler: every thread's stack to stderr
        time.sleep(1.0)
        problem = ("1", f"{exc}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
        reader.join(timeout=10)
        os.close(read_fd)
    if problem is None and proc.returncode != 0:
        problem = ("2", f"exit status {proc.returncode}")
    if problem is None and swallowed:
        problem = ("0", "; ".join(swallowed))
    if problem is not None and err.strip():
        ignored = [line for line in err.splitlines() if "Exception ignored" in line]
        problem = (problem[0], "\n".join([problem[1], *ignored[:5], err[-3000:].rstrip()]))
    oracle = [line for line in lines if line != "EOF"]
    if problem is None:
        return oracle, None
    return oracle, Violation(problem[0], f"sigint child round {rnd}", mode, "SIGINT",
                             landed_last(), problem[1])


def where_text(text: str) -> str:
    """A child's "file:line" landing as `where` shows points."""
    if text == "-":
        return "outside walj code"
    filename, _, line = text.rpartition(":")
    return where((filename, int(line))) if line.isdigit() else text


def feed_oracle(lines: list[str], appended: dict[int, dict[str, Any]], acks: JournalAcks,
                handlers: set[str], landed: list[str]) -> None:
    for line in lines:
        tag, *rest = line.split()
        if tag == "A":
            appended[int(rest[0])] = {"r": int(rest[1]), "n": int(rest[2])}
        elif tag == "T":
            acks.turns.add(int(rest[0]))
        elif tag == "C":
            acks.completed.add(int(rest[0]))
        elif tag == "F":
            acks.results[rest[0]] = rest[1]
        elif tag == "R":
            acks.resolved.add(rest[0])
        elif tag == "RT":
            acks.resolved_turns.add(int(rest[0]))
        elif tag == "H":
            handlers.add(rest[0])
        elif tag == "I":
            landed.append(rest[0])
        elif tag == "L":  # the documented Turn.__exit__ limit, met and handled as documented
            TALLY.add(sigint_turn_exit_limit=1)


def sigint_mode(tmp_path: Path, mode: str) -> tuple[list[Violation], list[str], int]:
    """SIGINT_ROUNDS children in one sync mode, then the invariants 3-6 from this process."""
    base = scratch(tmp_path) / mode
    base.mkdir(parents=True)
    rng = rng_for(f"interrupts:sigint:{mode}")
    appended: dict[int, dict[str, Any]] = {}
    acks = JournalAcks()
    handlers: set[str] = set()
    landed: list[str] = []
    violations: list[Violation] = []
    checked = 0
    for rnd in range(1, SIGINT_ROUNDS + 1):
        lines, failed = run_sigint_child(base, mode, rnd, rng)
        feed_oracle(lines, appended, acks, handlers, landed)
        report = Report(f"sigint round {rnd}", mode, Injection("count"))
        check_log_files(base / "log", report, sorted(appended.items()), ChildRecords(),
                        lambda: walj.Log.open(base / "log", **options(mode)))
        check_journal_files(base / "journal", report, acks)
        records = list(walj.read(base / "journal"))
        started = {r.data["execution_id"] for r in records
                   if r.data.get("kind") == "tool_execution_started"}
        for eid in handlers - started:
            report.fail("6", f"handler of {eid[:8]} ran without a durable intent")
        for eid, outcome in acks.results.items():
            if outcome == "blocked" and eid in handlers:
                report.fail("6", f"a dispatch came back blocked, yet its handler {eid[:8]} ran")
        violations.extend(([failed] if failed else []) + report.violations)
        checked += report.checked
        TALLY.add(lost=report.lost)
        if failed:
            return violations, landed, rnd * SIGINT_PER_CHILD
    # The end: open the journal here; dispatch runs exactly when a replay does not block, and
    # after resolving what the replay lists.
    report = Report("sigint final", mode, Injection("count"))
    journal = walj.ToolJournal.open(base / "journal", **options(mode))
    JournalFollowUps(report, acks, lenient=False).run(journal, base / "journal")
    violations.extend(report.violations)
    TALLY.add(trials_sigint=SIGINT_ROUNDS, checked=checked + report.checked)
    return violations, landed, SIGINT_ROUNDS * SIGINT_PER_CHILD


def test_interrupt_sigint_children(tmp_path: Path) -> None:
    """The black-box complement: real SIGINTs at random moments to children doing journal
    turns, dispatches and log appends in each sync mode (child_sigint.py). The child checks its
    live view against a replay after each; this process checks the files after each child."""
    with ThreadPoolExecutor(max_workers=len(MODES)) as pool:
        outcomes = list(pool.map(lambda mode: sigint_mode(tmp_path, mode), MODES))
    violations = [v for vs, _, _ in outcomes for v in vs]
    TALLY.add(faults=sum(sent for _, _, sent in outcomes))
    landed = [point for _, points, _ in outcomes for point in points]
    walj_points = {(p.rsplit(":", 1)[0], int(p.rsplit(":", 1)[1])) for p in landed
                   if p != "-" and p.rsplit(":", 1)[1].isdigit()}
    new = walj_points - _POINTS
    _POINTS.update(new)
    TALLY.add(interrupt_points=len(new), sigint_in_walj=len([p for p in landed if p != "-"]))
    if violations:
        pytest.fail(format_violations(violations), pytrace=False)
