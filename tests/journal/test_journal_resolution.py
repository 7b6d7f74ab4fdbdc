"""Resolution by people, policies and reconcile hooks; idempotency keys; bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import fingerprint
from journal_helpers import Recorder, records

import walj
from walj._codec import encode
from walj.journal import records as rc
from walj.journal._fingerprint import TRUNCATION_MARKER, idempotency_key
from walj.log._log import Log


def interrupt(path: Path, tool: str = "send", arguments: dict[str, Any] | None = None,
              **options: Any) -> walj.ToolContext:
    """Leave one ambiguous execution of `tool` in the journal at `path`; return its context."""
    seen: list[walj.ToolContext] = []

    def handler(context: walj.ToolContext, **_: Any) -> None:
        seen.append(context)
        raise KeyboardInterrupt

    with walj.ToolJournal.open(path, tools={tool: handler}, **options) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch(tool, arguments or {"to": "ann"}, call_id="call-7")
    return seen[0]


def test_resolution_unblocks_and_a_second_resolution_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j"
    context = interrupt(path)
    handler = Recorder()
    with walj.ToolJournal.open(path, tools={"send": handler}) as journal:
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve(context.execution_id, "failed", actor="ann")
        assert info.value.reason == "note_required"
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve(context.execution_id, "maybe", actor="ann")
        assert info.value.reason == "bad_outcome"
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve(context.execution_id, "succeeded", actor="policy")
        assert info.value.reason == "bad_actor"
        resolution = journal.resolve(context.execution_id, "succeeded", actor="ann",
                                     note="the mail is in the sent folder", output={"id": 42})
        assert (resolution.actor, resolution.outcome, resolution.output) == (
            "ann", "succeeded", {"id": 42})
        assert not journal.recovery.blocked
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve(context.execution_id, "not_performed", actor="bob")
        assert info.value.reason == "already_resolved"
        with journal.turn() as turn:
            assert turn.dispatch("send", {"to": "bob"}).outcome == "ok"
        assert handler.calls == [{"to": "bob"}]
    with walj.ToolJournal.open(path) as journal:
        assert not journal.recovery.blocked
        [resolved] = journal.recovery.resolved
        assert (resolved.execution_id, resolved.note) == (
            context.execution_id, "the mail is in the sent folder")
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve(context.execution_id, "succeeded", actor="bob")
        assert info.value.reason == "already_resolved"
    assert [r["kind"] for r in records(path)].count(rc.RESOLVED) == 1


def test_terminal_and_unknown_executions_cannot_be_resolved(tmp_path: Path) -> None:
    with walj.ToolJournal.open(tmp_path / "j", tools={"t": Recorder()}) as journal:
        with journal.turn() as turn:
            done = turn.dispatch("t", {})
        before = journal._log.last_seq
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve(done.execution_id, "failed", note="x", actor="ann")
        assert info.value.reason == "already_terminal"
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve("f" * 32, "succeeded", actor="ann")
        assert info.value.reason == "unknown"
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve_turn(1, actor="ann")
        assert info.value.reason == "already_terminal"
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve_turn(99, actor="ann")
        assert info.value.reason == "unknown"
        assert journal._log.last_seq == before  # refusals write nothing


def test_resolve_turn_unblocks_an_interrupted_turn(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"t": Recorder()}) as journal:
        with pytest.raises(RuntimeError), journal.turn() as turn:
            turn.dispatch("t", {})
            raise RuntimeError("crash between the tool and the end of the turn")
    with walj.ToolJournal.open(path) as journal:
        [blocker] = journal.recovery.blockers
        assert (blocker.state, blocker.turn_sequence) == ("interrupted_turn", 1)
        resolution = journal.resolve_turn(1, actor="ann", note="results were delivered")
        assert resolution.kind == "turn"
        assert not journal.recovery.blocked
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve_turn(1, actor="ann")
        assert info.value.reason == "already_resolved"
    with walj.ToolJournal.open(path) as journal:
        assert not journal.recovery.blocked


@pytest.mark.parametrize("policy,outcome", [("assume_done", "succeeded"), ("rerun", "rerun")])
def test_policies_settle_on_open_with_a_durable_resolution(
    tmp_path: Path, policy: str, outcome: str
) -> None:
    path = tmp_path / "j"
    context = interrupt(path)
    tools = {"send": walj.Tool(Recorder(), on_ambiguous=policy)}
    with walj.ToolJournal.open(path, tools=tools) as journal:
        assert not journal.recovery.blocked
        [resolution] = journal.recovery.resolved
    assert (resolution.execution_id, resolution.actor, resolution.outcome) == (
        context.execution_id, "policy", outcome)
    resolved = [r for r in records(path) if r["kind"] == rc.RESOLVED]
    assert [(r["actor"], r["outcome"]) for r in resolved] == [("policy", outcome)]


def test_fail_policy_and_unregistered_tools_stay_blocked(tmp_path: Path) -> None:
    path = tmp_path / "j"
    interrupt(path)
    with walj.ToolJournal.open(path, tools={"send": walj.Tool(Recorder())}) as journal:
        assert journal.recovery.blocked
    with walj.ToolJournal.open(path) as journal:
        assert journal.recovery.blocked
    assert not [r for r in records(path) if r["kind"] == rc.RESOLVED]


def test_reconcile_hook_settles_with_its_own_actor_and_sees_the_same_idempotency_key(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j"
    context = interrupt(path, arguments={"to": "ann", "token": "secret-value"})
    asked: list[walj.Blocker] = []

    def reconcile(blocker: walj.Blocker) -> str:
        asked.append(blocker)
        return "not_performed"

    tools = {"send": walj.Tool(Recorder(), reconcile=reconcile, on_ambiguous="assume_done")}
    with walj.ToolJournal.open(path, tools=tools) as journal:
        assert not journal.recovery.blocked
        [resolution] = journal.recovery.resolved
        log_id = journal.log_id
    [blocker] = asked
    assert blocker.idempotency_key == context.idempotency_key  # equal across the restart
    assert blocker.idempotency_key == idempotency_key(
        log_id, "call-7", "send", fingerprint({"to": "ann", "token": "secret-value"}))
    assert (blocker.tool, blocker.call_id, blocker.state) == ("send", "call-7", "ambiguous")
    assert blocker.arguments_sha256 == context.arguments_sha256
    assert "secret-value" not in (blocker.arguments_preview or "")
    assert (resolution.actor, resolution.outcome) == ("reconcile:send", "not_performed")


@pytest.mark.parametrize("answer", [RuntimeError("api down"), "perhaps"])
def test_a_failing_reconcile_hook_leaves_the_execution_blocked_and_is_recorded(
    tmp_path: Path, answer: object
) -> None:
    path = tmp_path / "j"
    interrupt(path)

    def reconcile(blocker: walj.Blocker) -> Any:
        if isinstance(answer, Exception):
            raise answer
        return answer

    tools = {"send": walj.Tool(Recorder(), reconcile=reconcile, on_ambiguous="assume_done")}
    with walj.ToolJournal.open(path, tools=tools) as journal:
        [blocker] = journal.recovery.blockers
        assert blocker.reconcile_error is not None
    failures = [r for r in records(path) if r["kind"] == rc.RECONCILE_FAILED]
    assert len(failures) == 1 and failures[0]["tool"] == "send"
    with walj.ToolJournal.open(path) as journal:  # still blocked; the failure is remembered
        assert journal.recovery.blockers[0].reconcile_error == failures[0]["error"]


def test_reconcile_answering_none_falls_back_to_the_policy(tmp_path: Path) -> None:
    path = tmp_path / "j"
    interrupt(path)
    tools = {"send": walj.Tool(Recorder(), reconcile=lambda b: None, on_ambiguous="assume_done")}
    with walj.ToolJournal.open(path, tools=tools) as journal:
        assert [r.actor for r in journal.recovery.resolved] == ["policy"]


def test_unserializable_arguments_write_nothing_and_call_nothing(tmp_path: Path) -> None:
    handler = Recorder()
    with walj.ToolJournal.open(tmp_path / "j", tools={"t": handler}) as journal:
        with journal.turn() as turn:
            before = journal._log.last_seq
            for bad in ({"x": object()}, {"x": float("nan")}, {"x": {1: 2}}, {"x": {1, 2}}):
                with pytest.raises(walj.SerializationError):
                    turn.dispatch("t", bad)
            with pytest.raises(TypeError):
                turn.dispatch("t", ["not", "a", "dict"])  # type: ignore[arg-type]
            with pytest.raises(walj.SerializationError):
                journal.handle_function_calls([
                    {"name": "t", "arguments": {"ok": 1}},
                    {"name": "t", "arguments": {"bad": object()}},
                ])
            assert journal._log.last_seq == before
        assert not journal.recovery.blocked
    assert handler.calls == []


def test_huge_arguments_are_fingerprinted_and_previewed_in_a_small_record(tmp_path: Path) -> None:
    args = {"blob": "x " * 1_000_000, "n": 1}
    handler = Recorder()
    with walj.ToolJournal.open(tmp_path / "j", tools={"t": handler}) as journal:
        with journal.turn() as turn:
            result = turn.dispatch("t", args)
    assert result.outcome == "ok" and len(handler.calls) == 1
    [started] = [r for r in records(tmp_path / "j") if r["kind"] == rc.STARTED]
    assert len(encode(started)) < 1500
    assert started["arguments_sha256"] == fingerprint(args)
    assert len(started["arguments_preview"]) <= 800
    assert started["arguments_preview"].endswith(TRUNCATION_MARKER)
    assert started["arguments_length"] > 2_000_000 and "arguments" not in started


def test_stored_arguments_over_the_record_limit_are_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    handler = Recorder()
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"t": handler}, store_arguments=True,
                               max_record_bytes=4096) as journal:
        with journal.turn() as turn:
            stored = turn.dispatch("t", {"x": 1})
            with pytest.raises(walj.RecordTooLargeError):
                turn.dispatch("t", {"blob": "x" * 10_000})
        assert not journal.recovery.blocked
    assert handler.calls == [{"x": 1}]
    started = [r for r in records(path) if r["kind"] == rc.STARTED]
    assert [r["arguments"] for r in started] == [{"x": 1}] and stored.outcome == "ok"


def test_custom_preview_sizes_and_redaction(tmp_path: Path) -> None:
    with walj.ToolJournal.open(tmp_path / "j", tools={"t": Recorder("y" * 500)},
                               preview_chars=40, output_preview_chars=60,
                               redact_keys=["pin"]) as journal:
        with journal.turn() as turn:
            turn.dispatch("t", {"pin": "1234", "text": "z" * 100})
    started, finished = [r for r in records(tmp_path / "j")
                         if r["kind"] in (rc.STARTED, rc.FINISHED)]
    assert len(started["arguments_preview"]) <= 40 and "1234" not in started["arguments_preview"]
    assert len(finished["output_preview"]) <= 60 and finished["output_length"] == 500
    with pytest.raises(ValueError):
        walj.ToolJournal.open(tmp_path / "k", preview_chars=0)


@pytest.mark.parametrize("session_id", ["", None, 42, b"user", "lone \ud800 surrogate"])
def test_empty_non_text_and_unencodable_session_ids_are_refused(tmp_path: Path,
                                                                session_id: Any) -> None:
    with pytest.raises(ValueError):
        walj.ToolJournal.open_session(tmp_path, session_id)
    assert list(tmp_path.iterdir()) == []


def test_safe_session_ids_open_their_own_directory(tmp_path: Path) -> None:
    with walj.ToolJournal.open_session(tmp_path, "user-42_chat.3", sync="batch") as journal:
        assert journal.path == tmp_path / "user-42_chat.3"
    with walj.ToolJournal.open_session(tmp_path, "x" * 128):
        pass


def test_an_unknown_contract_version_is_refused_on_open(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with Log.open(path) as log:
        log.append({"kind": rc.TURN_STARTED, "version": 99, "turn_sequence": 1, "at": 1.0})
    with pytest.raises(walj.UnsupportedVersionError):
        walj.ToolJournal.open(path)
    with Log.open(path) as log:  # the refused open released the directory
        assert log.last_seq == 1


def test_a_log_that_is_not_a_journal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j"
    with Log.open(path) as log:
        log.append({"hello": "world"})
    with pytest.raises(walj.CorruptionError):
        walj.ToolJournal.open(path)


def test_bad_options_and_calls_are_refused_with_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        walj.ToolJournal.open(tmp_path / "a", tools={"": Recorder()})
    with pytest.raises(TypeError):
        walj.ToolJournal.open(tmp_path / "b", tools={"t": 42})
    with pytest.raises(ValueError):
        walj.Tool(Recorder(), on_ambiguous="sometimes")
    with pytest.raises(TypeError):
        walj.ToolJournal.open(tmp_path / "c", redact_keys="password")
    with walj.ToolJournal.open(tmp_path / "d", tools={"t": Recorder()}) as journal:
        with journal.turn() as turn:
            before = journal._log.last_seq
            with pytest.raises(TypeError):
                turn.dispatch(3, {})  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                turn.dispatch("t", {}, call_id="")
            with pytest.raises(ValueError):
                journal.handle_function_calls([{"arguments": {}}])
            with pytest.raises(TypeError):
                journal.handle_function_calls({"name": "t"})  # type: ignore[arg-type]
            assert journal._log.last_seq == before
        with pytest.raises(walj.ResolutionError):
            journal.resolve_turn("1", actor="ann")  # type: ignore[arg-type]
        with pytest.raises(walj.ResolutionError):
            journal.resolve("x", "succeeded", actor="")
