"""walj.integrations.anthropic: the real Anthropic client on a scripted model, offline, with and
without a journal, and an agent loop SIGKILLed inside a tool, then recovered."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anthropic
import pytest
import sdk_fakes as fx
from journal_helpers import Recorder, kinds, records

import walj
from walj.integrations.anthropic import handle_tool_uses

STARTED, FINISHED, BLOCKED = ("tool_execution_started", "tool_execution_finished",
                              "tool_execution_blocked")


def refund_script() -> fx.ScriptedModel:
    return fx.ScriptedModel([
        fx.message(fx.text_block("Let me look."),
                   fx.tool_use("toolu_lookup", "lookup_order", {"order": 42})),
        fx.message(fx.tool_use("toolu_refund", "send_refund", {"order": 42, "amount": 30}),
                   fx.tool_use("toolu_note", "add_note", {"text": "remboursé ✓"})),
        fx.message(fx.text_block("Refunded order 42.")),
    ])


def refund_tools() -> dict[str, Recorder]:
    return {"lookup_order": Recorder({"order": 42, "amount": 30, "currency": "€"}),
            "send_refund": Recorder("refunded"), "add_note": Recorder(None)}


EXPECTED_RESULTS = [
    [{"type": "tool_result", "tool_use_id": "toolu_lookup",
      "content": '{"order": 42, "amount": 30, "currency": "€"}', "is_error": False}],
    [{"type": "tool_result", "tool_use_id": "toolu_refund", "content": "refunded",
      "is_error": False},
     {"type": "tool_result", "tool_use_id": "toolu_note", "content": "null", "is_error": False}],
]


@pytest.mark.parametrize("journaled", [True, False])
def test_a_three_round_loop_sends_each_tool_result_in_the_next_request(
    tmp_path: Path, journaled: bool
) -> None:
    model, tools = refund_script(), refund_tools()
    journal = walj.ToolJournal.open(tmp_path / "j") if journaled else None
    try:
        final = fx.anthropic_loop(fx.anthropic_client(model),
                                  [{"role": "user", "content": "refund 42"}], tools, journal)
    finally:
        if journal is not None:
            journal.close()
    assert final == "Refunded order 42."
    assert len(model.requests) == 3
    assert all(url.endswith("/v1/messages") for url in model.urls)
    assert fx.sent_tool_results(model, 1) == EXPECTED_RESULTS[0]
    assert fx.sent_tool_results(model, 2) == EXPECTED_RESULTS[1]
    # the assistant's tool_use blocks went back too, before their results
    assert model.requests[2]["messages"][-2]["content"][0]["id"] == "toolu_refund"
    assert tools["lookup_order"].calls == [{"order": 42}]
    assert tools["send_refund"].calls == [{"order": 42, "amount": 30}]
    assert tools["add_note"].calls == [{"text": "remboursé ✓"}]
    if not journaled:
        assert not (tmp_path / "j").exists()
        return
    # A clean run leaves no blocker and no blocked record, on reopen too. One turn per model
    # response that asked for tools; the provider's ids are the call ids.
    data = records(tmp_path / "j")
    started = [r for r in data if r["kind"] == STARTED]
    assert [r["call_id"] for r in started] == ["toolu_lookup", "toolu_refund", "toolu_note"]
    assert [r["turn_sequence"] for r in started] == [1, 2, 2]
    assert kinds(tmp_path / "j").count("turn_completed") == 2
    assert [r["outcome"] for r in data if r["kind"] == FINISHED] == ["ok", "ok", "ok"]
    assert BLOCKED not in kinds(tmp_path / "j")
    with walj.ToolJournal.open(tmp_path / "j") as reopened:
        assert not reopened.recovery.blocked and reopened.recovery.blockers == ()


def failing(**_: Any) -> None:
    raise ValueError("card declined")


def refusing(**_: Any) -> None:
    raise walj.ToolBlocked("over the refund limit")


@pytest.mark.parametrize("journaled", [True, False])
def test_errors_and_outputs_as_the_model_sees_them(tmp_path: Path, journaled: bool) -> None:
    when = datetime.date(2026, 1, 2)
    tools: dict[str, Any] = {
        "fail": failing, "refuse": refusing, "text": lambda: "plain text, not JSON",
        "data": lambda: {"when": when, "n": [1, 2.5]}, "nan": lambda: float("nan"),
    }
    content = [
        fx.text_block("working"),
        fx.tool_use("t_fail", "fail", {}), fx.tool_use("t_refuse", "refuse", {}),
        fx.tool_use("t_unknown", "missing", {}), fx.tool_use("t_text", "text", {}),
        fx.tool_use("t_data", "data", {}), fx.tool_use("t_nan", "nan", {}),
        {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
    ]
    journal = walj.ToolJournal.open(tmp_path / "j") if journaled else None
    try:
        results = handle_tool_uses(content, tools, journal)
    finally:
        if journal is not None:
            journal.close()
    by_id = {r["tool_use_id"]: r for r in results}
    assert [r["tool_use_id"] for r in results] == ["t_fail", "t_refuse", "t_unknown", "t_text",
                                                   "t_data", "t_nan"]
    assert all(set(r) == {"type", "tool_use_id", "content", "is_error"} for r in results)
    assert all(r["type"] == "tool_result" and isinstance(r["content"], str) for r in results)
    assert [r["is_error"] for r in results] == [True, True, True, False, False, False]
    assert by_id["t_fail"]["content"] == "ValueError: card declined"
    assert "over the refund limit" in by_id["t_refuse"]["content"]
    assert "unknown tool 'missing'" in by_id["t_unknown"]["content"]
    assert by_id["t_text"]["content"] == "plain text, not JSON"
    assert json.loads(by_id["t_data"]["content"]) == {"when": "2026-01-02", "n": [1, 2.5]}
    assert by_id["t_nan"]["content"] == "nan"  # not JSON: its repr, never invalid JSON
    if journaled:
        assert [r["outcome"] for r in records(tmp_path / "j") if r["kind"] == FINISHED] == [
            "error", "blocked", "ok", "ok", "ok"]


def test_an_interrupted_call_blocks_the_next_one_which_is_answered_as_an_error(
    tmp_path: Path
) -> None:
    def interrupted(cents: int) -> None:
        raise KeyboardInterrupt

    follow = Recorder()
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        with pytest.raises(KeyboardInterrupt):
            handle_tool_uses([fx.tool_use("t1", "charge", {"cents": 100})],
                             {"charge": interrupted}, journal)
        [blocker] = journal.recovery.blockers
        assert (blocker.tool, blocker.call_id, blocker.state) == ("charge", "t1", "ambiguous")
        [result] = handle_tool_uses([fx.tool_use("t2", "next", {})], {"next": follow}, journal)
        assert follow.calls == []
        assert result["tool_use_id"] == "t2" and result["is_error"] is True
        assert "was not run" in result["content"] and "'next'" in result["content"]
        journal.resolve(blocker.execution_id, "not_performed", actor="ops", note="no charge")
        [result] = handle_tool_uses([fx.tool_use("t3", "next", {})], {"next": follow}, journal)
        assert result == {"type": "tool_result", "tool_use_id": "t3", "content": "done",
                          "is_error": False}
    assert kinds(tmp_path / "j").count(BLOCKED) == 1


def test_arguments_the_model_sent_that_cannot_be_stored_fail_that_call_only(
    tmp_path: Path
) -> None:
    tools = {"echo": Recorder("ok")}
    content = [fx.tool_use("bad", "echo", {"text": "\ud800"}), fx.tool_use("good", "echo", {})]
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        bad, good = handle_tool_uses(content, tools, journal)
    assert bad["is_error"] is True and "surrogate" in bad["content"]
    assert good == {"type": "tool_result", "tool_use_id": "good", "content": "ok",
                    "is_error": False}
    assert tools["echo"].calls == [{}]


def test_arguments_a_program_built_that_json_cannot_hold_refuse_the_batch(
    tmp_path: Path
) -> None:
    tools = {"echo": Recorder()}
    content = [fx.tool_use("ok", "echo", {}), fx.tool_use("set", "echo", {"tags": {"a"}})]
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        with pytest.raises(walj.SerializationError):
            handle_tool_uses(content, tools, journal)
    assert tools["echo"].calls == [] and STARTED not in kinds(tmp_path / "j")


def test_sdk_objects_a_whole_message_and_a_toolset_member(tmp_path: Path) -> None:
    tools = {"navigate": Recorder("at the page"), "add": lambda a, b: a + b}
    # a browser toolset member: its input is a typed (pydantic) model, not a dict
    block = anthropic.types.BrowserNavigateToolUseBlock.model_validate(
        {"id": "t_nav", "name": "navigate", "type": "tool_use", "toolset_name": "browser",
         "caller": {"type": "direct"}, "input": {"url": "https://example.com"}})
    assert not isinstance(block.input, dict)
    reply = anthropic.types.Message.model_validate(
        fx.message(fx.text_block("hi"), fx.tool_use("t_add", "add", {"a": 1, "b": 2})))
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        [navigated] = handle_tool_uses([block], tools, journal)
        assert handle_tool_uses(reply, tools, journal) == [
            {"type": "tool_result", "tool_use_id": "t_add", "content": "3", "is_error": False}]
    assert navigated == {"type": "tool_result", "tool_use_id": "t_nav", "content": "at the page",
                         "is_error": False, "toolset_name": "browser"}
    assert tools["navigate"].calls == [{"url": "https://example.com"}]


def test_calls_join_the_live_turn_and_a_reply_without_tools_writes_nothing(
    tmp_path: Path
) -> None:
    tools = {"echo": Recorder()}
    with walj.ToolJournal.open(tmp_path / "j", tools=tools) as journal:
        assert handle_tool_uses([fx.text_block("no tools")], None, journal) == []
        assert handle_tool_uses("plain text content", None, journal) == []
        assert records(tmp_path / "j") == []
        with journal.turn() as turn:
            handle_tool_uses([fx.tool_use("a", "echo", {})], None, journal)
            handle_tool_uses([fx.tool_use("b", "echo", {})], None, journal)
    started = [r for r in records(tmp_path / "j") if r["kind"] == STARTED]
    assert [(r["call_id"], r["turn_sequence"]) for r in started] == [
        ("a", turn.sequence), ("b", turn.sequence)]
    assert kinds(tmp_path / "j").count("turn_started") == 1


def test_a_tool_use_block_without_an_id_runs_nothing(tmp_path: Path) -> None:
    tools = {"echo": Recorder()}
    content = [fx.tool_use("a", "echo", {}), {"type": "tool_use", "name": "echo", "input": {}}]
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        with pytest.raises(ValueError, match="tool_use block 1 has no id"):
            handle_tool_uses(content, tools, journal)
    assert tools["echo"].calls == []


def test_importing_walj_does_not_import_the_integration_and_a_missing_sdk_names_the_extra(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    fx.check_import_isolation(monkeypatch, "anthropic")


# --- a real crash -----------------------------------------------------------------------------


def test_sigkill_inside_a_tool_blocks_the_resumed_loop_until_it_is_resolved(
    tmp_path: Path
) -> None:
    path, effects = tmp_path / "j", tmp_path / "effects.txt"
    fx.run_child("anthropic", path, effects, "kill")
    [line] = fx.effect_lines(effects)  # the refund went out once, and no outcome was recorded

    refund, notify = Recorder("refunded"), Recorder("notified")
    tools = {"send_refund": refund, "notify_customer": notify}
    with walj.ToolJournal.open(path) as journal:
        [blocker] = journal.recovery.blockers
        assert (blocker.state, blocker.tool, blocker.call_id) == (
            "started", "send_refund", "toolu_refund")
        assert line.split()[-1] == blocker.idempotency_key

        # The resumed agent: the model asks for the refund again; walj refuses to run it.
        model = fx.ScriptedModel([
            fx.message(fx.tool_use("toolu_again", "send_refund", {"order": 42, "amount": 30})),
            fx.message(fx.text_block("The refund tool is blocked; an operator must check.")),
        ])
        fx.anthropic_loop(fx.anthropic_client(model),
                          [{"role": "user", "content": "refund order 42"}], tools, journal)
        [sent] = fx.sent_tool_results(model, 1)
        assert sent["tool_use_id"] == "toolu_again" and sent["is_error"] is True
        assert "was not run" in sent["content"]
        assert refund.calls == [] and fx.effect_lines(effects) == [line]
        assert journal.recovery.blocked

        # An operator finds the refund in the ledger and settles it; the loop completes.
        journal.resolve(blocker.execution_id, "succeeded", actor="ops",
                        note="refund 42 is in the ledger")
        model = fx.ScriptedModel([
            fx.message(fx.tool_use("toolu_notify", "notify_customer", {"order": 42})),
            fx.message(fx.text_block("Done: refunded and notified.")),
        ])
        final = fx.anthropic_loop(fx.anthropic_client(model),
                                  [{"role": "user", "content": "the refund went out"}],
                                  tools, journal)
        assert final == "Done: refunded and notified."
        assert fx.sent_tool_results(model, 1) == [
            {"type": "tool_result", "tool_use_id": "toolu_notify", "content": "notified",
             "is_error": False}]
        assert notify.calls == [{"order": 42}] and refund.calls == []
        assert not journal.recovery.blocked
    assert fx.effect_lines(effects) == [line]
    assert kinds(path).count(BLOCKED) == 1
    with walj.ToolJournal.open(path) as reopened:
        assert not reopened.recovery.blocked


# --- the example ------------------------------------------------------------------------------


def test_the_example_runs_offline_and_recovers() -> None:
    done = subprocess.run([sys.executable, str(fx.ROOT / "examples" / "anthropic_loop.py")],
                          capture_output=True, text=True, cwd=fx.ROOT, timeout=60,
                          env=fx.child_env(), check=False)
    assert done.returncode == 0, done.stderr
    assert "is_error=True" in done.stdout
    assert done.stdout.count("refund emails sent: 1") == 3
    assert done.stdout.rstrip().endswith("the loop finished")
