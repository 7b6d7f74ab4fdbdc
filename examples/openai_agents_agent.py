"""An OpenAI Agents SDK agent on walj, killed inside a tool, then recovered. Offline.

    python examples/openai_agents_agent.py

The SDK's own `ScriptedModel` stands in for the API, so nothing leaves the process and no API
key is needed. The script is both sides: run with `--life DIR` it is one life of the agent
process; run without arguments it tells the story, in a temporary directory:

1. A billing agent charges a card. Its charge_card tool makes the charge (a line in
   ledger.txt), and the agent process is killed with SIGKILL right then, before the SDK saved
   anything of that step to its Session.
2. The agent restarts on the same Session and journal. The Session dropped the call that had no
   output, so the model asks to charge the card again, with a new call id. walj does not run
   the tool: the model gets "not run: ..." as the tool's output, and the run goes on.
3. An operator checks the ledger and resolves the interrupted call as succeeded, with the
   `walj resolve` command.
4. The next run works again; the card was charged exactly once.
5. The model asks to refund the charge. refund_card needs approval (`needs_approval=True`):
   the run pauses, and walj has written a durable approval request bound to the arguments.
6. An operator approves it: the approval is written to the journal first, then to the SDK's
   RunState, and the process is killed right then, before the refund ran.
7. The application starts again, carries the journal's decisions into the saved RunState and
   resumes it: the refund runs once, with the approved arguments.

Needs `pip install 'walj[openai-agents]'`. Linux or macOS (the first life kills itself).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from agents import Agent, Runner, RunState, SQLiteSession, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from agents.tracing import set_tracing_disabled

import walj
from walj.integrations.openai_agents import (
    apply_journal_decisions,
    approve_interruption,
    interruption_approval,
    journal_tools,
    journaled_run,
)

set_tracing_disabled(True)  # offline: no trace export
SESSION = "customer:7"


def model(call_id: str, tool: str, arguments: dict[str, Any]) -> ScriptedModel:
    """Asks for one tool call, then says what the tool answered."""

    def respond(call: ModelCall) -> Any:
        items = call.input if isinstance(call.input, list) else []
        answers = [str(i["output"]) for i in items[-1:]
                   if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if answers:
            return [assistant_message(f"The {tool} tool answered: {answers[0]}")]
        return [function_call(tool, arguments, call_id=call_id)]

    return ScriptedModel([ModelStep.respond(respond), ModelStep.respond(respond)])


async def run(root: Path, request: str, call_id: str, tool: str, **arguments: Any) -> str:
    ledger = root / "ledger.txt"

    @function_tool
    def charge_card(card: str, cents: int) -> str:
        """Charge a card."""
        with ledger.open("a") as file:  # the side effect, made durable
            file.write(f"{card} {cents}\n")
            file.flush()
            os.fsync(file.fileno())
        if os.environ.get("CRASH_IN_TOOL"):
            os.kill(os.getpid(), signal.SIGKILL)  # charged, and the process is gone
        return f"charged {cents} cents to {card}"

    @function_tool
    def ledger_lines() -> list[str]:
        """The ledger's lines."""
        return ledger.read_text().splitlines() if ledger.exists() else []

    session = SQLiteSession(SESSION, str(root / "session.db"))
    # One journal per conversation, named by the Session's id (any text: a safe directory).
    with walj.ToolJournal.open_session(root / "journals", SESSION, store_outputs=True) as journal:
        agent = Agent(name="billing", instructions="Bill the customer.",
                      model=model(call_id, tool, arguments),
                      tools=journal_tools([charge_card, ledger_lines], journal))
        async with journaled_run(journal):
            result = await Runner.run(agent, request, session=session)
    session.close()
    return str(result.final_output)


def refund_agent(root: Path, journal: walj.ToolJournal) -> Agent[Any]:
    ledger = root / "ledger.txt"

    @function_tool(needs_approval=True)
    def refund_card(card: str, cents: int) -> str:
        """Refund a charge to a card."""
        with ledger.open("a") as file:
            file.write(f"{card} -{cents}\n")
            file.flush()
            os.fsync(file.fileno())
        return f"refunded {cents} cents to {card}"

    return Agent(name="billing", instructions="Bill the customer.",
                 model=model("call_r1", "refund_card", {"card": "4242", "cents": 1999}),
                 tools=journal_tools([refund_card], journal))


async def refund(root: Path, step: str) -> str:
    saved = root / "run_state.json"
    with walj.ToolJournal.open_session(root / "journals", SESSION, store_outputs=True) as journal:
        agent = refund_agent(root, journal)
        if step == "ask":
            async with journaled_run(journal):
                paused = await Runner.run(agent, "Refund that charge.")
            [item] = paused.interruptions
            saved.write_text(paused.to_state().to_string())
            request = interruption_approval(item, journal)
            return f"{request.approval_id} for {request.tool} {request.arguments_preview}"
        state = await RunState.from_string(agent, saved.read_text())
        if step == "approve_and_die":
            [item] = state.get_interruptions()
            approve_interruption(state, item, journal, actor="ops-bob", note="customer asked")
            os.kill(os.getpid(), signal.SIGKILL)  # approved, and the process is gone
        apply_journal_decisions(state, journal)  # the restarted application
        async with journaled_run(journal):
            done = await Runner.run(agent, state)
    return str(done.final_output)


def life(root: Path, step: str) -> None:
    if step == "approve_and_die":
        asyncio.run(refund(root, step))
    elif step == "crash":
        asyncio.run(run(root, "Charge card 4242 for 1999 cents.", "call_a1", "charge_card",
                        card="4242", cents=1999))
    else:  # the restarted agent: the model re-plans the charge with a new call id
        print(asyncio.run(run(root, "Did the charge go through?", "call_b1", "charge_card",
                              card="4242", cents=1999)))


def main() -> None:
    if sys.argv[1:2] == ["--life"]:
        life(Path(sys.argv[2]), sys.argv[3])
        return
    me = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print("1. The agent charges the card and is killed inside the tool (SIGKILL).")
        crashed = subprocess.run([sys.executable, me, "--life", tmp, "crash"],
                                 env={**os.environ, "CRASH_IN_TOOL": "1"})
        print(f"   exit status {crashed.returncode}; ledger: {(root / 'ledger.txt').read_text()!r}")

        print("2. The agent restarts on the same Session and journal; the model asks again:")
        again = subprocess.run([sys.executable, me, "--life", tmp, "again"],
                               capture_output=True, text=True, check=True)
        print("   " + again.stdout.strip())

        journal_dir = walj.ToolJournal.session_path(root / "journals", SESSION)
        with walj.ToolJournal.open(journal_dir) as journal:
            (blocker,) = journal.recovery.blockers
        print(f"3. An operator finds the charge in the ledger and resolves {blocker.tool} "
              f"(call {blocker.call_id}) as succeeded:")
        subprocess.run([sys.executable, "-m", "walj", "resolve", str(journal_dir),
                        blocker.execution_id, "--outcome", "succeeded", "--actor", "ops-ann",
                        "--note", "charge found in the ledger"], check=True,
                       stdout=subprocess.DEVNULL)

        print("4. The next run works again:")
        answer = asyncio.run(run(root, "Show me the ledger.", "call_c1", "ledger_lines"))
        print("   " + answer)
        lines = (root / "ledger.txt").read_text().splitlines()
        assert lines == ["4242 1999"], lines
        print("The card was charged exactly once.")

        print("5. The model asks for a refund, which needs approval; the run pauses:")
        print("   walj approval request " + asyncio.run(refund(root, "ask")))
        print("6. An operator approves it; the process is killed before the refund runs.")
        died = subprocess.run([sys.executable, me, "--life", tmp, "approve_and_die"])
        print(f"   exit status {died.returncode}; "
              f"ledger: {(root / 'ledger.txt').read_text().splitlines()}")
        print("7. The application starts again and resumes the saved run:")
        print("   " + asyncio.run(refund(root, "resume")))
        lines = (root / "ledger.txt").read_text().splitlines()
        assert lines == ["4242 1999", "4242 -1999"], lines
        print("The refund ran once, on its approval.")


if __name__ == "__main__":
    main()
