"""Live resolution: a journal applies resolution requests other processes leave in its log
directory, as its own durable records, exactly once, validated as ToolJournal.resolve is; and
walj.resolve_session, which resolves a session directly or through such a request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until
from journal_helpers import records

import walj
from walj.errors import ResolutionError
from walj.journal._requests import request_fields
from walj.journal.state import rebuild
from walj.log import post_request

ROOT = str(Path(__file__).resolve().parents[2])
ENV = {**os.environ, "PYTHONPATH": ROOT}


def send(to: str) -> str:
    return f"sent to {to}"


def _interrupted(**_: Any) -> None:
    raise KeyboardInterrupt


def blocked_journal(path: Path) -> str:
    """A journal left with one ambiguous `send` (a dispatch interrupted mid-handler); its id."""
    with walj.ToolJournal.open(path, tools={"send": send}) as journal:
        try:
            with journal.turn() as turn:
                turn.dispatch("send", {"to": "ada@example.com"}, handler=_interrupted)
        except KeyboardInterrupt:
            pass
        (blocker,) = [b for b in journal.recovery.blockers if b.execution_id]
        assert blocker.execution_id is not None
        return blocker.execution_id


def ask(path: Path, target: Any, outcome: Any = "not_performed", *, kind: str = "resolve",
        note: Any = "checked the outbox", actor: Any = "ann", at: Any = 1700000000.5) -> str:
    return post_request(path, {**request_fields(kind, target, outcome, note, actor, 0.0),
                               "at": at})


def answers(path: Path, request_id: str) -> list[dict[str, Any]]:
    return [r for r in records(path) if r.get("request") == request_id]


def pending(path: Path) -> list[str]:
    requests = path / "requests"
    return sorted(p.name for p in requests.iterdir()) if requests.exists() else []


def replayed(path: Path) -> Any:
    return rebuild((r.seq, r.data) for r in walj.read(path)).snapshot()


def test_a_request_is_applied_before_is_blocked_answers(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    with walj.ToolJournal.open(path, tools={"send": send}) as journal:
        assert journal.is_blocked()
        request_id = ask(path, eid)
        assert not journal.is_blocked()  # picked up synchronously, before the answer
        (record,) = answers(path, request_id)
        assert record["kind"] == "tool_execution_resolved" and record["execution_id"] == eid
        assert record["actor"] == "ann" and record["note"] == "checked the outbox"
        assert record["at"] == 1700000000.5  # the time the person asked
        (resolution,) = journal.recovery.resolved
        assert resolution.actor == "ann" and resolution.outcome == "not_performed"
        assert pending(path) == []
        result = journal.handle_function_calls([{"name": "send", "call_id": "c-1",
                                                 "arguments": '{"to": "bob"}'}])
        assert result[0]["error"] is None and result[0]["output"] == "sent to bob"
        assert journal.recovery == replayed(path)


def test_a_request_is_applied_before_a_dispatch_and_a_turn_start(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    with walj.ToolJournal.open(path, tools={"send": send}) as journal:
        ask(path, eid)
        with journal.turn() as turn:  # the turn start took it
            assert turn.dispatch("send", {"to": "bob"}).output == "sent to bob"
    eid = blocked_journal(tmp_path / "k")
    with walj.ToolJournal.open(tmp_path / "k", tools={"send": send}) as journal:
        with journal.turn() as turn:
            ask(tmp_path / "k", eid)
            assert turn.dispatch("send", {"to": "bob"}).output == "sent to bob"  # dispatch took it


def test_the_watcher_applies_a_request_while_the_journal_is_idle(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    with walj.ToolJournal.open(path, tools={"send": send}):
        request_id = ask(path, eid)
        deadline = time.monotonic() + 10
        while not answers(path, request_id) and time.monotonic() < deadline:
            time.sleep(0.05)  # the journal is not asked anything meanwhile
        (record,) = answers(path, request_id)
        assert record["kind"] == "tool_execution_resolved"
    assert pending(path) == []


def test_a_request_left_while_no_one_held_the_session_is_applied_on_open(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    request_id = ask(path, eid)
    with walj.ToolJournal.open(path) as journal:
        assert not journal.recovery.blocked
    assert len(answers(path, request_id)) == 1 and pending(path) == []


REFUSALS = [
    ("unknown", {"target": "f" * 32}),
    ("unknown", {"target": 12}),
    ("bad_actor", {"actor": "policy"}),
    ("bad_actor", {"actor": "reconcile:send"}),
    ("bad_actor", {"actor": "ann\x1b[2J"}),
    ("bad_actor", {"actor": None}),
    ("bad_outcome", {"outcome": "maybe"}),
    ("bad_outcome", {"outcome": ["succeeded"]}),
    ("note_required", {"outcome": "failed", "note": " "}),
    ("note_required", {"note": {"deep": [1]}}),
    ("unknown_kind", {"kind": "release_everything"}),
    ("unknown_kind", {"kind": None}),
    ("malformed", {"at": "yesterday"}),
    ("malformed", {"at": -1}),
    ("not_storable", {"note": "x" * 8000}),  # larger than the writer's records
    ("not_json", {"note": "\ud800 lone surrogate"}),
]


@pytest.mark.parametrize(("reason", "change"), REFUSALS,
                         ids=[f"{r}-{i}" for i, (r, _) in enumerate(REFUSALS)])
def test_an_invalid_request_is_refused_durably_and_changes_nothing(
        tmp_path: Path, reason: str, change: dict[str, Any]) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    fields = {**request_fields("resolve", eid, "not_performed", "n", "ann", 1.0), **change}
    if "\ud800" in str(fields["note"]):
        # Not even storable as a request by post (UTF-8): planted as a raw line.
        from walj.log.format import frame

        request_id = "e" * 32
        (path / "requests").mkdir()
        body = b'"request":{"id":"%s","kind":"resolve","target":"%s","outcome":"failed",' \
               b'"note":"\\ud800","actor":"ann","at":1.0}}' % (request_id.encode(), eid.encode())
        (path / "requests" / f"{request_id}.req").write_bytes(frame(body))
    else:
        request_id = post_request(path, fields)
    with walj.ToolJournal.open(path, max_record_bytes=4096) as journal:
        assert journal.is_blocked()
        (record,) = answers(path, request_id)
        assert record["kind"] == "resolution_refused" and record["reason"] == reason, record
        assert journal.recovery.resolved == ()
        assert journal.recovery == replayed(path)
    assert pending(path) == []


def test_an_already_resolved_execution_is_refused_and_a_garbage_file_too(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    with walj.ToolJournal.open(path) as journal:
        journal.resolve(eid, "succeeded", note="done", actor="bob")
        again = ask(path, eid)
        (path / "requests" / f"{'0' * 32}.req").write_bytes(b"\x00garbage" * 1000)
        os.mkfifo(path / "requests" / f"{'1' * 32}.req")
        assert not journal.is_blocked()
        assert [r["reason"] for r in answers(path, again)] == ["already_resolved"]
        assert [r["reason"] for r in answers(path, "0" * 32)] == ["torn"]  # no newline
        assert [r["reason"] for r in answers(path, "1" * 32)] == ["not_a_regular_file"]
        (resolution,) = journal.recovery.resolved
        assert resolution.actor == "bob"
    assert pending(path) == []


def test_a_turn_and_a_log_cut_are_resolved_by_request(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path) as journal:
        try:
            with journal.turn() as turn:
                turn.dispatch("send", {"to": "x"}, handler=send)
                raise RuntimeError("the loop crashed")
        except RuntimeError:
            pass
        (blocker,) = journal.recovery.blockers
        turn_request = ask(path, blocker.turn_sequence, None, kind="resolve_turn")
        assert not journal.is_blocked()
        (record,) = answers(path, turn_request)
        assert record["kind"] == "turn_resolved" and record["turn_sequence"] == 1
        cut_request = ask(path, "no-such-cut", "reviewed", note="looked")
        journal.is_blocked()
        (record,) = answers(path, cut_request)
        assert record["reason"] == "unknown"


CRASHER = textwrap.dedent("""
    import os, signal, sys, walj
    from walj.journal import _requests
    def crash(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)  # after the answer is durable, before the unlink
    _requests.remove_request = crash
    walj.ToolJournal.open(sys.argv[1])
""")


def test_a_crash_between_the_answer_and_the_unlink_applies_nothing_twice(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    request_id = ask(path, eid)
    child = subprocess.run([sys.executable, "-c", CRASHER, str(path)], env=ENV, check=False)
    assert child.returncode == -signal.SIGKILL
    assert pending(path) == [f"{request_id}.req"]  # the file stayed
    assert len(answers(path, request_id)) == 1  # the answer is durable
    with walj.ToolJournal.open(path) as journal:
        assert not journal.is_blocked()
    assert len(answers(path, request_id)) == 1 and pending(path) == []


def test_a_checkpoint_carries_answered_request_ids_past_compaction(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    request_id = ask(path, eid)
    kept = (path / "requests" / f"{request_id}.req").read_bytes()
    with walj.ToolJournal.open(path, segment_bytes=4096) as journal:
        for _ in range(3):
            with journal.turn() as turn:
                turn.dispatch("send", {"to": "x" * 500}, handler=send)
        journal.compact(keep_turns=0)
    assert answers(path, request_id) == []  # the answer was compacted away
    # The same file turns up again (a copy restored): its id is still known, nothing twice.
    (path / "requests" / f"{request_id}.req").write_bytes(kept)
    with walj.ToolJournal.open(path) as journal:
        assert journal.recovery.resolved[0].execution_id == eid
        assert not journal.is_blocked()
    assert answers(path, request_id) == [] and pending(path) == []


# --- resolve_session ----------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time, walj
    journal = walj.ToolJournal.open(sys.argv[1])
    print("ready", flush=True)
    time.sleep(120)
""")


def _holder(path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], env=ENV,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    return holder


def test_resolve_session_directly_when_no_one_holds_it(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    done = walj.resolve_session(path, eid, "succeeded", note="seen", actor="ann")
    assert done.status == "applied" and done.request_id is None
    assert done.resolution is not None and done.resolution.tool == "send"
    assert done.recovery is not None and not done.recovery.blocked
    again = walj.resolve_session(path, eid, "succeeded", note="seen", actor="ann")
    assert again.status == "refused" and again.reason == "already_resolved"
    assert again.error is not None and "already resolved" in again.error
    assert not (path / "requests").exists()


@pytest.mark.parametrize(("args", "reason"), [
    (("succeeded",), None), (("maybe",), "bad_outcome"), (("failed",), "note_required"),
])
def test_resolve_session_checks_before_it_asks(tmp_path: Path, args: tuple[str, ...],
                                               reason: str | None) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    actor = "policy" if reason is None else "ann"
    with pytest.raises(ResolutionError) as caught:
        walj.resolve_session(path, eid, *args, actor=actor)
    assert caught.value.reason == (reason or "bad_actor")
    with pytest.raises(ValueError, match="wait"):
        walj.resolve_session(path, eid, "succeeded", actor="ann", wait=-1)
    with pytest.raises(FileNotFoundError):
        walj.resolve_session(tmp_path / "none", eid, "succeeded", actor="ann")
    assert not (tmp_path / "none").exists() and not (path / "requests").exists()
    assert len(records(path)) == len(list(walj.read(path)))  # nothing written
    assert replayed(path).blocked


def test_resolve_session_through_a_live_writer_applied_and_refused(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    holder = _holder(path)
    try:
        done = walj.resolve_session(path, eid, "not_performed", note="n", actor="ann")
        assert done.status == "applied" and done.request_id is not None
        assert done.resolution is not None and done.resolution.execution_id == eid
        assert done.resolution.tool == "send" and done.resolution.note == "n"
        assert done.recovery is not None and not done.recovery.blocked
        again = walj.resolve_session(path, eid, "succeeded", note="n", actor="bob")
        assert again.status == "refused" and again.reason == "already_resolved"
        turn = walj.resolve_session_turn(path, 99, note="n", actor="bob")
        assert turn.status == "refused" and turn.reason == "unknown"
        # The holder removes each request file once its answer is durable, which an asker may
        # see first: wait for the removal while the holder lives, then kill it.
        assert wait_until(lambda: pending(path) == []), pending(path)
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


def test_a_queued_request_is_applied_once_the_writer_looks_again(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    holder = _holder(path)
    try:
        holder.send_signal(signal.SIGSTOP)  # a writer that cannot answer now
        done = walj.resolve_session(path, eid, "not_performed", note="n", actor="ann",
                                    wait=0.3)
        assert done.status == "queued" and done.request_id is not None
        assert done.resolution is None
        assert pending(path) == [f"{done.request_id}.req"]
        holder.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while not answers(path, done.request_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [r["kind"] for r in answers(path, done.request_id)] == [
            "tool_execution_resolved"]
    finally:
        holder.kill()
        holder.wait()
    assert not replayed(path).blocked


def test_a_request_queued_when_the_writer_dies_is_applied_by_the_asker(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    holder = _holder(path)
    holder.send_signal(signal.SIGSTOP)
    try:
        killer = subprocess.Popen([sys.executable, "-c",
                                   "import os, sys, time; time.sleep(0.3); "
                                   "os.kill(int(sys.argv[1]), 9)", str(holder.pid)])
        done = walj.resolve_session(path, eid, "succeeded", note="n", actor="ann", wait=10)
        killer.wait()
    finally:
        holder.kill()
        holder.wait()
    assert done.status == "applied" and done.request_id is not None
    assert len(answers(path, done.request_id)) == 1 and pending(path) == []


# --- release ------------------------------------------------------------------------------------

RELEASING = textwrap.dedent("""
    import sys, walj
    journal = walj.ToolJournal.open(sys.argv[1], release_on_request=sys.argv[2] == "yes")
    print("ready", flush=True)
    turn = None
    for line in sys.stdin:
        command = line.strip()
        try:
            if command == "enter":
                turn = journal.turn()
                turn.__enter__()
            elif command == "exit":
                turn.__exit__(None, None, None)
            elif command == "blocked":
                journal.is_blocked()
            print(f"ok closed={journal.closed}", flush=True)
        except walj.ClosedError:
            print("closed", flush=True)
""")


class Releasing:
    """A child holding the journal, taking one command per line."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", RELEASING, str(path), "yes" if enabled else "no"], env=ENV,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def say(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def test_a_release_closes_an_idle_holder_and_frees_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "j"
    eid = blocked_journal(path)
    holder = Releasing(path, enabled=True)
    try:
        assert holder.say("enter") == "ok closed=False"  # a live turn: not idle
        busy = walj.request_release(path, actor="langgraph-worker-2", wait=1.5)
        assert busy.status == "queued" and busy.request_id is not None
        assert holder.say("exit") == "ok closed=False"
        deadline = time.monotonic() + 10  # idle now: its watcher releases it
        while not answers(path, busy.request_id) and time.monotonic() < deadline:
            time.sleep(0.05)
        (record,) = answers(path, busy.request_id)
        assert record["kind"] == "journal_released" and record["actor"] == "langgraph-worker-2"
        # Closed right after its record (the lock is free once request_release says applied).
        while holder.say("blocked") != "ok closed=True" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holder.say("enter") == "closed"  # new work: ClosedError
        # The lock is free: this process opens the session and settles it.
        with walj.ToolJournal.open(path) as journal:
            journal.resolve(eid, "succeeded", note="seen", actor="ann")
        assert holder.process.poll() is None
    finally:
        holder.stop()
    assert pending(path) == [] and not replayed(path).blocked


def test_request_release_says_applied_once_the_lock_is_free(tmp_path: Path) -> None:
    path = tmp_path / "j"
    blocked_journal(path)
    holder = Releasing(path, enabled=True)
    try:
        done = walj.request_release(path, actor="worker", note="my turn")
        assert done.status == "applied" and done.request_id is not None
        with walj.ToolJournal.open(path) as journal:  # no wait for the lock
            assert journal.is_blocked()
        assert holder.say("enter") == "closed"
    finally:
        holder.stop()
    (record,) = answers(path, done.request_id)
    assert record["kind"] == "journal_released" and record["note"] == "my turn"


def test_a_release_is_refused_by_a_holder_that_does_not_take_them(tmp_path: Path) -> None:
    path = tmp_path / "j"
    blocked_journal(path)
    holder = Releasing(path, enabled=False)
    try:
        done = walj.request_release(path, actor="worker", note="need it")
        assert done.status == "refused" and done.reason == "release_not_enabled"
        assert holder.say("blocked") == "ok closed=False"
        with pytest.raises(ResolutionError):
            walj.request_release(path, actor="policy")
    finally:
        holder.stop()
    free = walj.request_release(path, actor="worker")  # no holder now: free at once
    assert free.status == "applied" and free.request_id is None
    assert pending(path) == []


def test_a_release_left_for_a_holder_that_went_away_is_refused_on_open(tmp_path: Path) -> None:
    path = tmp_path / "j"
    blocked_journal(path)
    request_id = post_request(path, request_fields("release", None, None, None, "worker", 1.0))
    with walj.ToolJournal.open(path, release_on_request=True) as journal:
        assert not journal.closed  # a new holder does not close on an old request
    (record,) = answers(path, request_id)
    assert record["kind"] == "resolution_refused" and record["reason"] == "not_held"


def test_a_log_cut_of_a_live_writer_is_resolved_by_request(tmp_path: Path) -> None:
    """Damage no crash explains (a zeroed sector among synced turns) blocks as log_damage; a
    person settles it from another process while a writer holds the journal."""
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, sync="always") as journal:
        for i in range(8):
            with journal.turn() as turn:
                turn.dispatch("send", {"to": f"user{i}"}, handler=send)
    (segment,) = sorted(path.glob("seg-*.jsonl"))
    data = bytearray(segment.read_bytes())
    start = (data.index(b'"kind":"turn_started"', data.index(b'"turn_sequence":3,') - 60)
             + 511) // 512 * 512
    data[start:start + 512] = bytes(512)
    segment.write_bytes(bytes(data))
    holder = _holder(path)  # its open cuts the damage and records it: log_damage blocks
    try:
        (blocker,) = replayed(path).blockers
        assert blocker.state == "log_damage" and blocker.quarantine_file is not None
        refused = walj.resolve_session(path, blocker.quarantine_file, "succeeded", note="n",
                                       actor="ann")
        assert refused.status == "refused" and refused.reason == "bad_outcome"
        done = walj.resolve_session(path, blocker.quarantine_file, "reviewed",
                                    note="the cut turns were re-run by hand", actor="ann")
        assert done.status == "applied" and done.request_id is not None
        assert done.resolution is not None and done.resolution.kind == "log_cut"
        assert done.recovery is not None and not done.recovery.blocked
    finally:
        holder.kill()
        holder.wait()
    assert len(answers(path, refused.request_id or "")) == 1
