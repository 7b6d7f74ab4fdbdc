"""walj.integrations.openai: the real OpenAI client (Responses API) on a scripted model, offline,
with and without a journal, and an agent loop SIGKILLed inside a tool, then recovered."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
import sdk_fakes as fx
from journal_helpers import Recorder, kinds, records

import walj
from walj.integrations.openai import BLOCKED_PREFIX, ERROR_PREFIX, handle_response_calls

STARTED, FINISHED, BLOCKED = ("tool_execution_started", "tool_execution_finished",
                              "tool_execution_blocked")


def invoice_script() -> fx.ScriptedModel:
    return fx.ScriptedModel([
        fx.response({"type": "reasoning", "id": "rs_1", "summary": []},
                    fx.function_call("call_invoice", "get_invoice", {"customer": "cus_7"})),
        fx.response(fx.function_call("call_charge", "charge_card",
                                     {"customer": "cus_7", "cents": 4200}),
                    fx.function_call("call_note", "add_note", {"text": "payé ✓"})),
        fx.response(fx.output_message("Charged 42.00.")),
    ])


def invoice_tools() -> dict[str, Recorder]:
    return {"get_invoice": Recorder({"due_cents": 4200, "currency": "€"}),
            "charge_card": Recorder("charged"), "add_note": Recorder(None)}


@pytest.mark.parametrize("journaled", [True, False])
def test_a_three_round_loop_sends_each_output_in_the_next_request(
    tmp_path: Path, journaled: bool
) -> None:
    model, tools = invoice_script(), invoice_tools()
    journal = walj.ToolJournal.open(tmp_path / "j") if journaled else None
    try:
        final = fx.openai_loop(fx.openai_client(model),
                               [{"role": "user", "content": "collect"}], tools, journal)
    finally:
        if journal is not None:
            journal.close()
    assert final == "Charged 42.00."
    assert len(model.requests) == 3
    assert all(url.endswith("/v1/responses") for url in model.urls)
    assert fx.sent_call_outputs(model, 1) == [
        {"type": "function_call_output", "call_id": "call_invoice",
         "output": '{"due_cents": 4200, "currency": "€"}'}]
    assert fx.sent_call_outputs(model, 2) == [
        {"type": "function_call_output", "call_id": "call_charge", "output": "charged"},
        {"type": "function_call_output", "call_id": "call_note", "output": "null"}]
    # each output follows the function_call it answers, which went back too
    tail = model.requests[2]["input"][-4:]
    assert [(i["type"], i["call_id"]) for i in tail] == [
        ("function_call", "call_charge"), ("function_call", "call_note"),
        ("function_call_output", "call_charge"), ("function_call_output", "call_note")]
    assert tools["get_invoice"].calls == [{"customer": "cus_7"}]
    assert tools["charge_card"].calls == [{"customer": "cus_7", "cents": 4200}]
    assert tools["add_note"].calls == [{"text": "payé ✓"}]
    if not journaled:
        assert not (tmp_path / "j").exists()
        return
    data = records(tmp_path / "j")
    started = [r for r in data if r["kind"] == STARTED]
    assert [r["call_id"] for r in started] == ["call_invoice", "call_charge", "call_note"]
    assert [r["turn_sequence"] for r in started] == [1, 2, 2]
    assert kinds(tmp_path / "j").count("turn_completed") == 2
    assert [r["outcome"] for r in data if r["kind"] == FINISHED] == ["ok", "ok", "ok"]
    assert BLOCKED not in kinds(tmp_path / "j")
    with walj.ToolJournal.open(tmp_path / "j") as reopened:
        assert not reopened.recovery.blocked and reopened.recovery.blockers == ()


def failing(**_: Any) -> None:
    raise ValueError("card declined")


@pytest.mark.parametrize("journaled", [True, False])
def test_bad_arguments_run_nothing_and_errors_say_so(tmp_path: Path, journaled: bool) -> None:
    echo = Recorder("echoed")
    tools: dict[str, Any] = {"echo": echo, "fail": failing, "data": lambda: {"n": [1, 2.5]}}
    items = [
        fx.output_message("working"),
        fx.function_call("c_bad", "echo", "{not json"),
        fx.function_call("c_array", "echo", "[1, 2]"),
        fx.function_call("c_nan", "echo", '{"x": NaN}'),
        fx.function_call("c_fail", "fail", "{}"),
        fx.function_call("c_unknown", "missing", "{}"),
        fx.function_call("c_empty", "echo", ""),
        fx.function_call("c_data", "data", "{}"),
        {"type": "custom_tool_call", "id": "ct_1", "call_id": "c_custom", "name": "echo",
         "input": "raw"},
    ]
    journal = walj.ToolJournal.open(tmp_path / "j") if journaled else None
    try:
        outputs = handle_response_calls(items, tools, journal)
    finally:
        if journal is not None:
            journal.close()
    assert all(set(o) == {"type", "call_id", "output"} for o in outputs)
    assert all(o["type"] == "function_call_output" for o in outputs)
    by_id = {o["call_id"]: o["output"] for o in outputs}
    assert list(by_id) == ["c_bad", "c_array", "c_nan", "c_fail", "c_unknown", "c_empty",
                           "c_data"]
    assert by_id["c_bad"].startswith(ERROR_PREFIX + "arguments are not valid JSON")
    assert by_id["c_array"] == ERROR_PREFIX + "arguments must be a JSON object, not list"
    assert by_id["c_nan"].startswith(ERROR_PREFIX + "arguments are not valid JSON")
    assert by_id["c_fail"] == ERROR_PREFIX + "ValueError: card declined"
    assert by_id["c_unknown"].startswith(ERROR_PREFIX) and "'missing'" in by_id["c_unknown"]
    assert by_id["c_empty"] == "echoed"  # no arguments at all is an empty object
    assert json.loads(by_id["c_data"]) == {"n": [1, 2.5]}
    assert echo.calls == [{}]  # only the call with usable arguments ran
    if journaled:
        started = [r["call_id"] for r in records(tmp_path / "j") if r["kind"] == STARTED]
        assert started == ["c_fail", "c_empty", "c_data"]  # nothing was recorded for the rest


def test_an_interrupted_call_blocks_the_next_one_whose_output_says_it_was_not_run(
    tmp_path: Path
) -> None:
    def interrupted(cents: int) -> None:
        raise KeyboardInterrupt

    follow = Recorder()
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        with pytest.raises(KeyboardInterrupt):
            handle_response_calls([fx.function_call("c1", "charge", {"cents": 100})],
                                  {"charge": interrupted}, journal)
        [blocker] = journal.recovery.blockers
        assert (blocker.tool, blocker.call_id, blocker.state) == ("charge", "c1", "ambiguous")
        [out] = handle_response_calls([fx.function_call("c2", "next", {})], {"next": follow},
                                      journal)
        assert follow.calls == [] and out["call_id"] == "c2"
        assert out["output"].startswith(BLOCKED_PREFIX)
        assert "was not run" in out["output"] and "'next'" in out["output"]
        journal.resolve(blocker.execution_id, "not_performed", actor="ops", note="no charge")
        assert handle_response_calls([fx.function_call("c3", "next", {})], {"next": follow},
                                     journal) == [
            {"type": "function_call_output", "call_id": "c3", "output": "done"}]
    assert kinds(tmp_path / "j").count(BLOCKED) == 1


def test_sdk_objects_and_a_whole_response(tmp_path: Path) -> None:
    from openai.types.responses import Response, ResponseFunctionToolCall

    tools = {"add": lambda a, b: a + b}
    item = ResponseFunctionToolCall(type="function_call", call_id="c_add", name="add",
                                    arguments='{"a": 1, "b": 2}', id="fc_1")
    reply = Response.model_validate(fx.response(
        fx.output_message("hi"), fx.function_call("c_add2", "add", {"a": 2, "b": 3})))
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        assert handle_response_calls([item], tools, journal) == [
            {"type": "function_call_output", "call_id": "c_add", "output": "3"}]
        assert handle_response_calls(reply, tools, journal) == [
            {"type": "function_call_output", "call_id": "c_add2", "output": "5"}]
    # the provider's call_id is the identity, not the item's own id
    assert [r["call_id"] for r in records(tmp_path / "j") if r["kind"] == STARTED] == [
        "c_add", "c_add2"]


def test_calls_join_the_live_turn_and_output_without_calls_writes_nothing(
    tmp_path: Path
) -> None:
    tools = {"echo": Recorder()}
    with walj.ToolJournal.open(tmp_path / "j", tools=tools) as journal:
        assert handle_response_calls([fx.output_message("no tools")], None, journal) == []
        assert records(tmp_path / "j") == []
        with journal.turn() as turn:
            handle_response_calls([fx.function_call("a", "echo", {})], None, journal)
            handle_response_calls([fx.function_call("b", "echo", {})], None, journal)
    started = [r for r in records(tmp_path / "j") if r["kind"] == STARTED]
    assert [(r["call_id"], r["turn_sequence"]) for r in started] == [
        ("a", turn.sequence), ("b", turn.sequence)]
    assert kinds(tmp_path / "j").count("turn_started") == 1


def test_a_function_call_without_a_call_id_runs_nothing(tmp_path: Path) -> None:
    tools = {"echo": Recorder()}
    items = [fx.function_call("a", "echo", {}),
             {"type": "function_call", "name": "echo", "arguments": "{}"}]
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        with pytest.raises(ValueError, match="function_call item 1 has no call_id"):
            handle_response_calls(items, tools, journal)
    assert tools["echo"].calls == []


def test_importing_walj_does_not_import_the_integration_and_a_missing_sdk_names_the_extra(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    assert openai.__name__ == "openai"  # the SDK, not walj's module of the same name
    fx.check_import_isolation(monkeypatch, "openai")


# --- a real crash -----------------------------------------------------------------------------


def test_sigkill_inside_a_tool_blocks_the_resumed_loop_until_the_cli_resolves_it(
    tmp_path: Path
) -> None:
    path, effects = tmp_path / "j", tmp_path / "effects.txt"
    fx.run_child("openai", path, effects, "kill")
    [line] = fx.effect_lines(effects)  # the refund went out once, and no outcome was recorded

    refund, notify = Recorder("refunded"), Recorder("notified")
    tools = {"send_refund": refund, "notify_customer": notify}
    with walj.ToolJournal.open(path) as journal:
        [blocker] = journal.recovery.blockers
        assert (blocker.state, blocker.tool, blocker.call_id) == (
            "started", "send_refund", "call_refund")
        assert line.split()[-1] == blocker.idempotency_key

        model = fx.ScriptedModel([
            fx.response(fx.function_call("call_again", "send_refund",
                                         {"order": 42, "amount": 30})),
            fx.response(fx.output_message("The refund tool is blocked.")),
        ])
        fx.openai_loop(fx.openai_client(model),
                       [{"role": "user", "content": "refund order 42"}], tools, journal)
        [sent] = fx.sent_call_outputs(model, 1)
        assert sent["call_id"] == "call_again"
        assert sent["output"].startswith(BLOCKED_PREFIX) and "was not run" in sent["output"]
        assert refund.calls == [] and fx.effect_lines(effects) == [line]
    assert kinds(path).count(BLOCKED) == 1

    done = subprocess.run(
        [sys.executable, "-m", "walj", "resolve", str(path), blocker.execution_id,
         "--outcome", "succeeded", "--note", "refund 42 is in the ledger", "--actor", "ops"],
        capture_output=True, text=True, cwd=fx.ROOT, env=fx.child_env(), check=False)
    assert done.returncode == 0, done.stderr

    with walj.ToolJournal.open(path) as journal:
        assert not journal.recovery.blocked
        [resolution] = journal.recovery.resolved
        assert (resolution.execution_id, resolution.outcome, resolution.actor) == (
            blocker.execution_id, "succeeded", "ops")
        model = fx.ScriptedModel([
            fx.response(fx.function_call("call_notify", "notify_customer", {"order": 42})),
            fx.response(fx.output_message("Done: refunded and notified.")),
        ])
        final = fx.openai_loop(fx.openai_client(model),
                               [{"role": "user", "content": "the refund went out"}], tools,
                               journal)
        assert final == "Done: refunded and notified."
        assert fx.sent_call_outputs(model, 1) == [
            {"type": "function_call_output", "call_id": "call_notify", "output": "notified"}]
        assert notify.calls == [{"order": 42}] and refund.calls == []
    assert fx.effect_lines(effects) == [line]
    assert kinds(path).count(BLOCKED) == 1


def test_a_clean_run_in_a_child_leaves_no_blocker(tmp_path: Path) -> None:
    path, effects = tmp_path / "j", tmp_path / "effects.txt"
    fx.run_child("openai", path, effects, "clean")
    assert len(fx.effect_lines(effects)) == 1
    assert BLOCKED not in kinds(path)
    assert kinds(path).count(STARTED) == kinds(path).count(FINISHED) == 2
    with walj.ToolJournal.open(path) as journal:
        assert not journal.recovery.blocked and journal.recovery.blockers == ()


# --- the example ------------------------------------------------------------------------------


def test_the_example_runs_offline_and_recovers() -> None:
    done = subprocess.run([sys.executable, str(fx.ROOT / "examples" / "openai_responses.py")],
                          capture_output=True, text=True, cwd=fx.ROOT, timeout=60,
                          env=fx.child_env(), check=False)
    assert done.returncode == 0, done.stderr
    assert "not run: The tool 'charge_card' was not run" in done.stdout
    assert "no blocker left: dispatch resumes" in done.stdout
    assert done.stdout.count("charges in the ledger: 1") == 3
    assert done.stdout.rstrip().endswith("the loop finished")
