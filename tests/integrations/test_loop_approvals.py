"""Approvals in the raw loops (walj.integrations.anthropic and .openai): the model gets the
approval answer as the tool result of a call that awaits approval, was denied, or whose approval
expired, never an invented output; an approved call runs once. The real SDK clients on a
scripted model, offline, and loops SIGKILLed after the approval and after the call ran."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import loop_approval_child as child
import pytest
import sdk_fakes as fx
from journal_helpers import records

import walj

CHILD = Path(__file__).with_name("loop_approval_child.py")
PROVIDERS = ("anthropic", "openai")


def answer_calls(provider: str, calls: list[tuple[str, str, dict[str, Any]]], registry: Any,
                 journal: walj.ToolJournal | None) -> list[tuple[str, bool]]:
    """The text of each tool result (and whether the provider marks it an error) for one
    response holding `calls` (call id, tool, arguments)."""
    if provider == "anthropic":
        from walj.integrations.anthropic import handle_tool_uses

        blocks = [fx.tool_use(call_id, name, args) for call_id, name, args in calls]
        return [(r["content"], r["is_error"]) for r in handle_tool_uses(blocks, registry,
                                                                         journal)]
    from walj.integrations.openai import ERROR_PREFIX, handle_response_calls

    items = [fx.function_call(call_id, name, args) for call_id, name, args in calls]
    return [(r["output"], r["output"].startswith(ERROR_PREFIX))
            for r in handle_response_calls(items, registry, journal)]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_model_gets_the_approval_answer_and_an_approved_call_runs_once(
    tmp_path: Path, provider: str
) -> None:
    runs: list[dict[str, Any]] = []

    def pay(to: str, cents: int) -> str:
        runs.append({"to": to, "cents": cents})
        return f"paid {cents}"

    registry = {"pay": walj.Tool(pay, approval=True), "echo": lambda text: text}
    ann, bob, eve = {"to": "ann", "cents": 5}, {"to": "bob", "cents": 6}, {"to": "eve", "cents": 7}
    with pytest.raises(ValueError, match="needs a journal"):  # nothing could wait: none runs
        answer_calls(provider, [("c_echo", "echo", {"text": "hi"}), ("c_ann", "pay", ann)],
                     registry, None)
    assert runs == []
    with walj.ToolJournal.open(tmp_path / "j", store_outputs=True) as journal:
        # One response: echo runs, both pay calls wait; the model is told so, with the ids.
        first = answer_calls(provider, [("c_echo", "echo", {"text": "hi"}), ("c_ann", "pay", ann),
                                        ("c_bob", "pay", bob), ("c_eve", "pay", eve)],
                             registry, journal)
        assert first[0] == ("hi", False) and runs == []
        requests = {a.call_id: a for a in journal.recovery.approvals}
        for (text, is_error), call_id in zip(first[1:], ("c_ann", "c_bob", "c_eve"),
                                             strict=True):
            said = json.loads(text)
            assert said["status"] == "awaiting_approval" and said["call_id"] == call_id
            assert said["approval_id"] == requests[call_id].approval_id
            assert (is_error, said["tool"]) == (provider == "anthropic", "pay")

        journal.approve(requests["c_ann"].approval_id, actor="ops")
        journal.deny(requests["c_bob"].approval_id, actor="ops", note="wrong account")
        journal.approve(requests["c_eve"].approval_id, actor="ops", expires_at=time.time() + 0.3)
        time.sleep(0.4)  # past eve's expiry
        # ann with other arguments is refused, an ordinary error; its approval stands.
        [(other, is_error)] = answer_calls(provider, [("c_ann", "pay", {**ann, "cents": 500})],
                                           registry, journal)
        assert is_error and requests["c_ann"].approval_id in other and runs == []
        assert not other.startswith("{")  # not an approval answer: a refusal
        # The same calls answered again: ann runs once, bob is denied, eve's approval expired.
        again = answer_calls(provider, [("c_ann", "pay", ann), ("c_bob", "pay", bob),
                                        ("c_eve", "pay", eve)], registry, journal)
        assert again[0] == ("paid 5", False) and runs == [ann]
        denied, expired = json.loads(again[1][0]), json.loads(again[2][0])
        assert (denied["status"], denied["approval_id"]) == (
            "denied", requests["c_bob"].approval_id)
        assert "wrong account" in denied["message"]
        assert (expired["status"], expired["approval_id"]) == (
            "approval_expired", requests["c_eve"].approval_id)
        [(replayed, _)] = answer_calls(provider, [("c_ann", "pay", ann)], registry, journal)
        assert replayed == "paid 5" and runs == [ann]


def run_child(provider: str, where: Path, mode: str) -> dict[str, Any]:
    """Run loop_approval_child.py; a "kill_*" MODE is SIGKILLed once it parked, "run" returns
    the tool result it printed."""
    process = subprocess.Popen([sys.executable, str(CHILD), provider, str(where / "j"),
                                str(where / "effects.txt"), mode], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=fx.ROOT, env=fx.child_env())
    assert process.stdout is not None and process.stderr is not None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            assert selector.select(fx.HANG_GUARD), "the child said nothing"
            line = process.stdout.readline().strip()
        if mode.startswith("kill"):
            assert line == "PARKED", (line, process.stderr.read())
            os.kill(process.pid, signal.SIGKILL)
        process.wait(fx.HANG_GUARD)
        assert mode.startswith("kill") or process.returncode == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()
    if mode.startswith("kill"):
        assert process.returncode == -signal.SIGKILL
        return {}
    printed: dict[str, Any] = json.loads(line)
    return printed


@pytest.mark.parametrize("provider", PROVIDERS)
def test_sigkill_after_the_approval_and_after_the_run_runs_the_call_once_as_approved(
    tmp_path: Path, provider: str
) -> None:
    effects = tmp_path / "effects.txt"
    # The loop's first answer to the call (here, in this process) writes the request.
    with walj.ToolJournal.open(tmp_path / "j", store_outputs=True) as journal:
        [(text, _)] = answer_calls(provider, [(child.REFUND_ID[provider], "send_refund",
                                               child.REFUND)],
                                   {"send_refund": child.send_refund(str(effects))}, journal)
    said = json.loads(text)
    assert said["status"] == "awaiting_approval" and fx.effect_lines(effects) == []

    # An operator approves from another process; the loop answers the call again and is
    # killed before its intent.
    approved = walj.approve_session(tmp_path / "j", said["approval_id"], actor="ops",
                                    note="the customer is owed it")
    assert approved.status == "applied"
    run_child(provider, tmp_path, "kill_before_run")
    assert fx.effect_lines(effects) == []

    # Again, killed once the call ran and its outcome is durable, before its turn completed.
    run_child(provider, tmp_path, "kill_after_run")
    [line] = fx.effect_lines(effects)

    # Again: the call is answered from its record, not run a second time.
    sent = run_child(provider, tmp_path, "run")
    assert sent.get("content", sent.get("output")) == "refunded"
    assert fx.effect_lines(effects) == [line]
    data = records(tmp_path / "j")
    [intent] = [r for r in data if r["kind"] == "tool_execution_started"]
    [requested] = [r for r in data if r["kind"] == "tool_approval_requested"]
    assert intent["approval_id"] == said["approval_id"]
    assert intent["arguments_sha256"] == requested["arguments_sha256"]
    assert line.split()[-1] == intent["idempotency_key"]
    with walj.ToolJournal.open(tmp_path / "j") as journal:
        assert journal.approval(said["approval_id"]).status == "consumed"
        assert [b.state for b in journal.recovery.blockers] == ["interrupted_turn"]
