"""Damage to synced records never unblocks a journal: random journal histories in every sync
mode, then one aligned 512-byte sector zeroed or filled with random bytes anywhere before the
last byte that a later record shows was synced. The reopened journal blocks, or refuses to open
with CorruptionError, and never runs a call that was settled or in doubt.

What "synced" means here follows the documented durability, not the journal's own bookkeeping:
with sync="always" or "batch" every append returns synced; in every mode an intent, a terminal
record, a resolution or a replay answer is synced before `dispatch` or `resolve` returns (the
records the docs list as written in the log's mode are not). A sync covers every byte written
before it. Record k was therefore synced before record j was written when a sync that covered
k returned, in j's own process, before j was appended; the damage may hit anything up to the
last such k. (A sync with nothing after it proves nothing to a reader: the record it covered
may as well have died in it. Nor does a close: the next process counts from its own syncs.)

Default budget: a few seconds. WALJ_TORTURE scales it (tests/torture/budget.py); WALJ_SEED
replays a failure."""

from __future__ import annotations

import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import walj
from tests.torture.budget import reproduce_hint, rng_for, scaled

SECTOR = 512
MODES = ("always", "batch", "interval", "never")
# The records docs/RECOVERY.md lists as written in the log's sync mode; every other record
# the journal writes is synced before the call that wrote it returns.
IN_LOG_MODE = frozenset({"turn_started", "turn_completed", "tool_execution_blocked",
                         "tool_execution_reconcile_failed", "llm_call_started",
                         "llm_call_finished"})
CALL_IDS = [None, None, "c0", "c1", "c2", "c3"]
_RECORD_LINE = re.compile(rb'\{"xxh64":"[0-9a-f]{16}","seq":([0-9]+),')


class LeftTurn(Exception):
    """The caller's code raised inside a turn: it is left without turn_completed."""


@dataclass
class History:
    """What a run wrote: the caller-given call ids whose handler ran (settled or in doubt),
    and the last seq of each process that wrote, in order."""

    mode: str
    options: dict[str, Any]
    ran: dict[str, dict[str, Any]] = field(default_factory=dict)  # call id -> arguments
    session_ends: list[int] = field(default_factory=list)


class Tools:
    """The handlers: each call is counted, so a run after the damage is seen."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def table(self) -> dict[str, Any]:
        def ok(**arguments: Any) -> Any:
            self.calls.append(("ok", arguments))
            return {"done": arguments}

        def fails(**arguments: Any) -> Any:
            self.calls.append(("fails", arguments))
            raise ValueError("refused by the far side")

        def unknown(**arguments: Any) -> Any:
            self.calls.append(("unknown", arguments))
            raise walj.ToolOutcomeUnknown("connection lost after the request went out")

        return {"ok": ok, "fails": fails, "unknown": unknown}


def _turn(journal: walj.ToolJournal, rng: random.Random, history: History) -> None:
    try:
        with journal.turn() as turn:
            for _ in range(rng.randint(0, 3)):
                tool = rng.choice(["ok", "ok", "fails", "unknown"])
                call_id = rng.choice(CALL_IDS)
                arguments = history.ran.get(call_id or "", {"v": rng.randint(0, 9)})
                try:
                    result = turn.dispatch(tool, dict(arguments), call_id=call_id)
                except walj.ToolOutcomeUnknown:
                    result = None
                if call_id is not None and (result is None or result.outcome in ("ok", "error")):
                    history.ran[call_id] = arguments
            if rng.random() < 0.2:
                raise LeftTurn
    except LeftTurn:
        pass


def _resolve_all(journal: walj.ToolJournal, rng: random.Random) -> None:
    """Settle every blocker, so the undamaged journal reopens unblocked."""
    for blocker in journal.recovery.blockers:
        if blocker.state == "interrupted_turn" and blocker.turn_sequence is not None:
            journal.resolve_turn(blocker.turn_sequence, actor="ann", note="looked")
        elif blocker.execution_id:
            outcome = rng.choice(["succeeded", "failed", "not_performed"])
            journal.resolve(blocker.execution_id, outcome, actor="ann", note="checked by hand")


def write_history(path: Path, rng: random.Random, mode: str) -> History:
    options: dict[str, Any] = {"sync": mode, "checkpoint_every": None,
                               "segment_bytes": rng.choice([4096, 1 << 20])}
    history = History(mode, options)
    tools = Tools()
    for session in range(rng.randint(1, 3)):
        with walj.ToolJournal.open(path, tools=tools.table(), **options) as journal:
            if session == 0:  # an intent, then its terminal: something is proven synced
                with journal.turn() as turn:
                    turn.dispatch("ok", {"v": 0})
            for _ in range(rng.randint(1, 5)):
                if rng.random() < 0.25:
                    with journal.llm_call(model="m", request={"q": rng.randint(0, 9)}) as call:
                        call.finish({"a": 1})
                else:
                    _turn(journal, rng, history)
                if rng.random() < 0.3:
                    _resolve_all(journal, rng)
            _resolve_all(journal, rng)
            history.session_ends.append(journal._core.log.last_seq)
    return history


def record_ends(path: Path) -> dict[int, tuple[str, int]]:
    """Where each record's line ends: seq -> (segment file, offset just past its newline)."""
    ends: dict[int, tuple[str, int]] = {}
    for segment in sorted(p for p in path.iterdir() if p.name.startswith("seg-")):
        data = segment.read_bytes()
        start = 0
        while (newline := data.find(b"\n", start)) >= 0:
            found = _RECORD_LINE.match(data, start)
            if found:
                ends[int(found.group(1))] = (segment.name, newline + 1)
            start = newline + 1
    return ends


def last_proven_synced(path: Path, history: History) -> int:
    """The highest seq k such that a sync covering k returned before a later record was
    written, in that record's own process (see the module's docstring); 0 for none."""
    proven = 0
    first = 1
    records = [(r.seq, r.data["kind"]) for r in walj.read(path)]
    for end in history.session_ends:
        synced = 0  # what this process has seen synced
        for seq, kind in records:
            if not first <= seq <= end:
                continue
            proven = max(proven, synced)
            if history.mode in ("always", "batch") or kind not in IN_LOG_MODE:
                synced = seq
        first = end + 1
    return proven


def sectors_before(path: Path, ends: dict[int, tuple[str, int]], seq: int) -> list[tuple[str,
                                                                                           int]]:
    """Every aligned sector, in any segment, that lies wholly before record `seq`'s end."""
    segment, end = ends[seq]
    found = []
    for file in sorted(p for p in path.iterdir() if p.name.startswith("seg-")):
        limit = end if file.name == segment else file.stat().st_size
        if file.name > segment:
            break
        found += [(file.name, start) for start in range(0, limit - SECTOR + 1, SECTOR)]
    return found


def _damage(path: Path, segment: str, start: int, rng: random.Random) -> str:
    file = path / segment
    data = bytearray(file.read_bytes())
    how = rng.choice(["zeros", "random"])
    data[start : start + SECTOR] = (bytes(SECTOR) if how == "zeros"
                                    else rng.randbytes(SECTOR))
    file.write_bytes(bytes(data))
    return how


def _redispatch(journal: walj.ToolJournal, history: History, tools: Tools) -> None:
    with journal.turn() as turn:
        for call_id, arguments in history.ran.items():
            for tool in ("ok", "fails", "unknown"):
                # Blocked, or answered from the settled call (replayed or refused): not run.
                turn.dispatch(tool, dict(arguments), call_id=call_id)
    assert tools.calls == [], "a settled or in-doubt call ran again"


def check_history(tmp: Path, name: str, mode: str) -> int:
    rng = rng_for(name)
    pristine = tmp / "pristine"
    history = write_history(pristine, rng, mode)
    with walj.ToolJournal.open(pristine, tools=Tools().table(), **history.options) as journal:
        assert not journal.recovery.blocked, journal.recovery.blockers  # the damage blocks
    proven = last_proven_synced(pristine, history)
    sectors = sectors_before(pristine, record_ends(pristine), proven)
    checked = 0
    for trial in range(min(len(sectors), 4)):
        segment, start = rng.choice(sectors)
        damaged = tmp / f"damaged-{trial}"
        shutil.copytree(pristine, damaged)
        how = _damage(damaged, segment, start, rng)
        where = (f"{history.mode}: {how} at {segment}:{start}, records through seq {proven} "
                 f"synced; {reproduce_hint()}")
        tools = Tools()
        try:
            journal = walj.ToolJournal.open(damaged, tools=tools.table(), **history.options)
        except walj.CorruptionError:
            checked += 1
            continue
        with journal:
            assert journal.recovery.blocked, where
            _redispatch(journal, history, tools)
        checked += 1
    return checked


@pytest.mark.parametrize("mode", MODES)
def test_damage_before_the_last_synced_byte_blocks_and_runs_nothing_again(
        tmp_path_factory: pytest.TempPathFactory, mode: str) -> None:
    for i in range(scaled(2)):
        checked = check_history(tmp_path_factory.mktemp("h"), f"damage-property-{mode}-{i}", mode)
        assert checked > 0, "every history has a synced record to damage"
