"""Journal-backed approvals in the Pydantic AI integration: a `requires_approval` call is
deferred with its walj approval request, `DeferredToolResults` become journal decisions, the
journal decides what runs (once, with the approved arguments), and a crash around an approval
never runs a call twice."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sdk_fakes import child_env

import walj

pytest.importorskip("pydantic_ai")

import pydantic_ai_approval_child as ac  # noqa: E402
import pydantic_ai_child as pc  # noqa: E402
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved  # noqa: E402

from walj.integrations.pydantic_ai import (  # noqa: E402
    METADATA_KEY,
    WaljCapability,
    approval_decisions,
    journal_answers,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHILD = HERE / "pydantic_ai_approval_child.py"
HANG = 120  # seconds: only a guard against a hung child, never what a test checks


def run(agent: Any, **options: Any) -> Any:
    return asyncio.run(agent.run(**options))


def ask(agent: Any, conversation: str) -> tuple[Any, DeferredToolRequests, str]:
    """The first run: it ends with the deferred call; its result, requests and approval id."""
    result = run(agent, user_prompt="refund order 7", conversation_id=conversation)
    requests = result.output
    assert isinstance(requests, DeferredToolRequests)
    [part] = requests.approvals
    entry = requests.metadata[part.tool_call_id][METADATA_KEY]
    assert (entry["status"], entry["tool"], entry["call_id"]) == ("pending", "send_refund",
                                                                  pc.CALL_ID)
    return result, requests, entry["approval_id"]


def test_an_approval_runs_the_call_once_and_only_with_its_arguments(tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    with walj.ToolJournal.open(tmp_path / "j", store_outputs=True) as journal, \
            WaljCapability(journal) as capability:
        agent = ac.approval_agent(capability, effects)
        asked, requests, approval_id = ask(agent, "c1")
        assert [a.approval_id for a in journal.recovery.approvals] == [approval_id]
        history = asked.all_messages()

        # Approved with other arguments: refused, nothing written, nothing run.
        changed = DeferredToolResults(approvals={pc.CALL_ID: ToolApproved(
            override_args={"order": 7, "amount": 3000})})
        result = run(agent, message_history=history, deferred_tool_results=changed)
        assert result.output.startswith("failed: walj: not run: the approval changes")
        assert journal.approval(approval_id).status == "pending"

        # A decision signed as an automatic actor, or naming a call that was not deferred:
        # refused with a typed error before anything runs or is written.
        with pytest.raises(ValueError, match="not approval requests"):
            approval_decisions(requests, actor="ann", approve=["call_other"])
        spoofed = approval_decisions(requests, actor="policy", approve=[pc.CALL_ID])
        with pytest.raises(walj.ApprovalError) as refused:
            run(agent, message_history=history, deferred_tool_results=spoofed)
        assert refused.value.reason == "bad_actor"
        assert journal.approval(approval_id).status == "pending"

        # ann's approval: written to the journal, then consumed by the one run of the call.
        answer = approval_decisions(requests, actor="ann", approve=[pc.CALL_ID], note="ok")
        result = run(agent, message_history=history, deferred_tool_results=answer)
        assert result.output == "success: refunded 30 on order 7"
        approval = journal.approval(approval_id)
        assert (approval.status, approval.actor, approval.note) == ("consumed", "ann", "ok")

        # The same answer again (an ordinary retry of the resumed run): answered from the
        # record, never run twice on one approval.
        result = run(agent, message_history=history, deferred_tool_results=answer)
        assert result.output == "success: refunded 30 on order 7"
        assert agent.refund_calls == [7]  # type: ignore[attr-defined]
    assert effects.read_text().splitlines() == ["refund 7 30"]


def test_a_denial_and_a_decision_made_outside_the_app(tmp_path: Path) -> None:
    effects = tmp_path / "effects"
    with WaljCapability(tmp_path / "sessions") as capability:
        agent = ac.approval_agent(capability, effects)
        asked, requests, denied_id = ask(agent, "denied")
        answer = approval_decisions(requests, actor="bob", deny=[pc.CALL_ID], note="no refunds")
        result = run(agent, message_history=asked.all_messages(), deferred_tool_results=answer)
        assert result.output == "denied: denied by bob: no refunds"
        assert capability.journal_for("denied").approval(denied_id).status == "denied"

        asked, requests, approved_id = ask(agent, "outside")
        # Let through to the journal before anyone decided: deferred again, the same request.
        again = run(agent, message_history=asked.all_messages(),
                    deferred_tool_results=journal_answers(requests))
        assert isinstance(again.output, DeferredToolRequests)
        assert again.output.metadata[pc.CALL_ID][METADATA_KEY]["approval_id"] == approved_id
        capability.release("outside")
    path = walj.ToolJournal.session_path(tmp_path / "sessions", "outside")
    walj.approve_session(path, approved_id, actor="carol")
    with WaljCapability(tmp_path / "sessions") as capability:
        agent = ac.approval_agent(capability, effects)
        result = run(agent, message_history=asked.all_messages(),
                     deferred_tool_results=journal_answers(requests))
        assert result.output == "success: refunded 30 on order 7"
        assert capability.journal_for("outside").approval(approved_id).actor == "carol"
    assert agent.refund_calls == [7]  # type: ignore[attr-defined]
    assert effects.read_text().splitlines() == ["refund 7 30"]


# --- the crash: real child processes, real SIGKILL --------------------------------------------


def life(tmp: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), str(tmp / "sessions"), str(tmp / "effects"),
         str(tmp / "history"), mode],
        capture_output=True, text=True, cwd=HERE, env=child_env(), timeout=HANG)


def in_process(tmp: Path, mode: str) -> dict[str, Any]:
    """A life that ends normally, run in this process."""
    return ac.life(str(tmp / "sessions"), tmp / "effects", tmp / "history", mode)


def test_killed_after_the_approval_and_after_the_call_runs_it_once(tmp_path: Path) -> None:
    approval_id = in_process(tmp_path, "ask")["approval_id"]
    effects = tmp_path / "effects"
    path = walj.ToolJournal.session_path(tmp_path / "sessions", pc.CONVERSATION)

    # Killed once ann's approval is durable, before the call was executed.
    killed = life(tmp_path, "approve_kill_before")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not effects.exists()
    with walj.ToolJournal.open(path) as journal:
        assert journal.approval(approval_id).status == "approved"

    # Resumed with the same answer: the approval is used (once), and the process is killed
    # after the call ran, before Pydantic AI finished the step.
    killed = life(tmp_path, "approve_kill_after")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert effects.read_text().splitlines() == ["refund 7 30"]

    # Resumed again with the same answer: answered from the record.
    assert in_process(tmp_path, "approve")["output"] == "success: refunded 30 on order 7"
    assert effects.read_text().splitlines() == ["refund 7 30"]
    with walj.ToolJournal.open(path) as journal:
        approval = journal.approval(approval_id)
    assert (approval.status, approval.actor) == ("consumed", "ann")
