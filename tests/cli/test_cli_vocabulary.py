"""One name for each event: what the API returns for a dispatch is what its record, `walj
timeline`, `walj stats`, `walj inspect`, `walj dump` and `walj sweep` call it, in text and JSON.
And help texts a person with an installed walj can follow: `walj resolve --help` says what each
outcome does to the next dispatch (checked against what the journal then does), and no help
text points into the source tree."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import ENV, walj_cli

import walj
from walj.cli._main import build_parser, main
from walj.journal import records as rc


def run(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().out


def as_json(capsys: pytest.CaptureFixture[str], *args: Any) -> Any:
    return json.loads(run(capsys, *args, "--json")[1])


def rows(text: str) -> list[str]:
    """The text view's lines with their column padding folded to one space."""
    return [" ".join(line.split()) for line in text.splitlines()]


def kinds_of(path: Path) -> list[str]:
    return [r.data["kind"] for r in walj.read(path)]


def guard_says_no(context: walj.ToolContext) -> None:
    raise walj.ToolBlocked("not during the freeze")


def lost(order_id: str) -> None:
    raise walj.ToolOutcomeUnknown("the connection dropped after the request went out")


def blocked_journal(path: Path) -> dict[str, walj.ToolResult]:
    """`pay` blocked twice, both outcome `blocked` in the API: once by its guard (a
    tool_execution_finished), once by the journal, blocked by an ambiguous `charge`
    (a tool_execution_blocked)."""
    tools = {"pay": walj.Tool(lambda order_id: "paid", guard=guard_says_no), "charge": lost}
    with walj.ToolJournal.open(path, tools=tools) as journal:
        with journal.turn() as turn:
            by_guard = turn.dispatch("pay", {"order_id": "A-1"}, call_id="g1")
        with pytest.raises(walj.ToolOutcomeUnknown), journal.turn() as turn:
            turn.dispatch("charge", {"order_id": "A-2"}, call_id="c1")
        with journal.turn() as turn:
            by_journal = turn.dispatch("pay", {"order_id": "A-3"}, call_id="p1")
    return {"guard": by_guard, "journal": by_journal}


def test_a_blocked_dispatch_is_blocked_in_the_api_records_timeline_stats_inspect_and_sweep(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "root" / "session"
    results = blocked_journal(log)
    assert {r.outcome for r in results.values()} == {"blocked"}
    assert rc.BLOCKED == "tool_execution_blocked" in kinds_of(log)
    turned_away = results["journal"].execution_id

    timeline = as_json(capsys, "timeline", log)
    assert timeline["schema"] == "walj.timeline/3"
    (item,) = [i for t in timeline["turns"] for i in t["blocked"]]
    assert item["outcome"] == "blocked" and item["execution_id"] == turned_away
    assert item["blocked_by"] == [results["journal"].output["ambiguous_executions"][0][
        "execution_id"]]
    assert all(t["refused"] == [] and t["replayed"] == [] for t in timeline["turns"])
    (guarded,) = timeline["turns"][0]["executions"]
    assert guarded["outcome"] == "blocked"
    text = rows(run(capsys, "timeline", log)[1])
    assert any(f"pay p1 blocked - BLOCKED exec {turned_away[:12]} the journal was blocked by "
               "1 blocker(s); nothing ran" in row for row in text), text
    assert any("pay g1 blocked" in row for row in text)
    assert not any("REFUSED" in row or "BLOCKED-DISPATCH" in row for row in text)

    stats = as_json(capsys, "stats", log)
    assert stats["schema"] == "walj.stats/2"
    pay = next(t for t in stats["tools"] if t["tool"] == "pay")
    assert (pay["calls"], pay["blocked"], pay["refused"]) == (2, 2, 0)
    assert "interrupted" not in pay
    header, line = [r for r in rows(run(capsys, "stats", log)[1])
                    if r.startswith(("TOOL", "pay"))]
    columns = dict(zip(header.replace("ERROR RATE", "ERROR_RATE").split(), line.split(),
                       strict=False))  # the durations may hold spaces
    assert (columns["BLOCKED"], columns["REFUSED"]) == ("2", "0")
    assert "INTERRUPTED" not in columns

    status = as_json(capsys, "inspect", log, turned_away)["status"]
    assert status.startswith("blocked (") and "refused" not in status
    shown = rows(run(capsys, "inspect", log, turned_away)[1])
    assert "status blocked (the journal was blocked; nothing ran)" in shown
    assert any("tool_execution_blocked" in row and row.endswith(
        "pay p1 turn 3 blocked: the journal was blocked by 1 blocker(s)")
        for row in rows(run(capsys, "dump", log)[1]))

    (session,) = as_json(capsys, "sweep", tmp_path / "root", "--jobs", "1")["sessions"]
    inspected = as_json(capsys, "inspect", log)
    assert session["status"] == "blocked" and inspected["blocked"] is True
    assert [b["state"] for b in session["blockers"]] == [
        b["state"] for b in inspected["blockers"]] == ["ambiguous"]
    assert any("BLOCKED" in row and "charge ambiguous" in row
               for row in rows(run(capsys, "sweep", tmp_path / "root", "--jobs", "1")[1]))


def test_replayed_and_refused_dispatches_have_their_own_names_and_counts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "j"
    with walj.ToolJournal.open(log, tools={"send": lambda to: f"sent to {to}"},
                               store_outputs=True) as journal:
        with journal.turn() as turn:
            turn.dispatch("send", {"to": "ann"}, call_id="c1")
            replayed = turn.dispatch("send", {"to": "ann"}, call_id="c1")
            refused = turn.dispatch("send", {"to": "bob"}, call_id="c1")
    assert replayed.replayed and replayed.outcome == "ok" and refused.outcome == "refused"
    assert kinds_of(log).count(rc.REFUSED) == kinds_of(log).count(rc.REPLAYED) == 1

    (turn_json,) = as_json(capsys, "timeline", log)["turns"]
    assert [i["outcome"] for i in turn_json["replayed"]] == ["ok"]
    (item,) = turn_json["refused"]
    assert item["outcome"] == "refused" and item["execution_id"] == refused.execution_id
    assert item["refused_reason"] == rc.REFUSED_ARGUMENTS_DIFFER
    assert item["settled_execution_id"] == replayed.execution_id
    assert turn_json["blocked"] == []
    text = rows(run(capsys, "timeline", log)[1])
    assert any("send c1 refused - REFUSED" in row and "arguments_differ; nothing ran" in row
               for row in text)
    assert any("send c1 ok - REPLAYED" in row for row in text)
    assert not any("SETTLED-CALL" in row for row in text)

    (send,) = as_json(capsys, "stats", log)["tools"]
    assert (send["calls"], send["ok"], send["replayed"], send["refused"], send["blocked"]) == (
        3, 1, 1, 1, 0)
    counted = ("ok", "error", "cancelled", "blocked", "ambiguous", "replayed", "refused")
    assert sum(send[c] for c in counted) == send["calls"]  # each dispatch counted once

    status = as_json(capsys, "inspect", log, refused.execution_id)["status"]
    assert status.startswith("refused (call id already settled: arguments_differ")


ESCAPE = "\x1b]0;owned\x07\x1b[2J"  # a terminal title and a screen clear


def test_blocked_replayed_and_refused_records_with_hostile_fields(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each field of the three records a view now reads by name is of the wrong type or holds
    escapes: the views show them as unknown or escaped, and count each dispatch once."""
    log = tmp_path / "j"
    common = {"version": 3, "at": 1700000000.5, "turn_sequence": 1}
    with walj.Log.open(log) as raw:
        raw.append({"kind": "turn_started", **common})
        raw.append({"kind": "tool_execution_blocked", "execution_id": "b" * 32, **common,
                    "tool": "send" + ESCAPE, "call_id": ["c1"], "blocked_by": "x" * 5,
                    "blocked_by_turns": [True, "2", 3]})
        raw.append({"kind": "tool_execution_replayed", "execution_id": "r" * 32, **common,
                    "tool": "send" + ESCAPE, "call_id": "c2", "outcome": "ok" + ESCAPE,
                    "answered_from_seq": "7"})
        raw.append({"kind": "tool_execution_refused", "execution_id": "f" * 32, **common,
                    "tool": "send" + ESCAPE, "call_id": "c3", "refused_reason": {"a": 1},
                    "settled_execution_id": 5, "error": ESCAPE})
        raw.append({"kind": "turn_completed", **common})
    (turn,) = as_json(capsys, "timeline", log)["turns"]
    (blocked,), (replayed,), (refused,) = turn["blocked"], turn["replayed"], turn["refused"]
    assert (blocked["call_id"], blocked["blocked_by"], blocked["blocked_by_turns"]) == (
        None, [], [3])
    assert replayed["outcome"] == "ok" + ESCAPE and replayed["answered_from_seq"] is None
    assert refused["refused_reason"] is None and refused["settled_execution_id"] is None
    code, text = run(capsys, "timeline", log)
    assert code == 0 and "\x1b" not in text and "\x07" not in text
    assert [r.split()[5] for r in rows(text) if r.startswith(("|-", "`-", "├─", "└─"))] == [
        "BLOCKED", "REPLAYED", "REFUSED"]
    (send,) = as_json(capsys, "stats", log)["tools"]
    assert send["tool"] == "send" + ESCAPE
    assert (send["calls"], send["blocked"], send["replayed"], send["refused"]) == (3, 1, 1, 1)
    code, text = run(capsys, "stats", log)
    assert code == 0 and "\x1b" not in text and "\x07" not in text


def kill_mid_tool(path: Path) -> None:
    """A real process SIGKILLed inside a handler: the intent is durable, nothing after it."""
    script = ("import os, signal, sys, walj\n"
              "def die(order_id):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
              "with walj.ToolJournal.open(sys.argv[1], tools={'charge': die}) as journal:\n"
              "    with journal.turn() as turn:\n"
              "        turn.dispatch('charge', {'order_id': 'A-9'}, call_id='k1')\n")
    proc = subprocess.run([sys.executable, "-c", script, str(path)], env=ENV, timeout=60,
                          capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_an_ambiguous_execution_has_its_blocker_state_in_timeline_and_stats(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    killed, interrupted = tmp_path / "killed", tmp_path / "interrupted"
    kill_mid_tool(killed)
    blocked_journal(interrupted)
    for log, state in ((killed, "started"), (interrupted, "ambiguous")):
        (blocker,) = as_json(capsys, "inspect", log)["blockers"]
        assert blocker["state"] == state
        (execution,) = [e for t in as_json(capsys, "timeline", log)["turns"]
                        for e in t["executions"] if e["tool"] == "charge"]
        assert execution["outcome"] == state and execution["ambiguous"] is True
        assert any(f"charge {blocker['call_id']} {state} - AMBIGUOUS BLOCKER" in row
                   for row in rows(run(capsys, "timeline", log)[1]))
        charge = next(t for t in as_json(capsys, "stats", log)["tools"] if t["tool"] == "charge")
        assert (charge["calls"], charge["ambiguous"]) == (1, 1)


# --- help texts -----------------------------------------------------------------------------


def resolve_help() -> dict[str, str]:
    """`walj resolve --help`'s line for each outcome, by outcome."""
    text = walj_cli("resolve", "--help").out
    found = dict(re.findall(r"^  (succeeded|failed|not_performed|reviewed) +(.+)$", text, re.M))
    assert set(found) == {"succeeded", "failed", "not_performed", "reviewed"}, text
    return found


def counting(runs: list[str]) -> Any:
    """A tool that records the idempotency key of each run; its first run's outcome is lost."""
    def charge(order_id: str, context: walj.ToolContext) -> str:
        runs.append(context.idempotency_key)
        if len(runs) == 1:
            raise walj.ToolOutcomeUnknown("lost the answer")
        return "charged"
    return charge


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "not_performed"])
def test_resolve_help_says_what_each_outcome_does_to_the_next_dispatch(
        tmp_path: Path, outcome: str) -> None:
    said = resolve_help()[outcome]
    log, runs = tmp_path / "j", list[str]()
    with walj.ToolJournal.open(log, tools={"charge": counting(runs)}) as journal:
        with pytest.raises(walj.ToolOutcomeUnknown), journal.turn() as turn:
            turn.dispatch("charge", {"order_id": "A-1"}, call_id="c1")
        (blocker,) = journal.recovery.blockers
    resolved = walj_cli("resolve", log, blocker.execution_id, "--outcome", outcome,
                        "--note", "checked the ledger", "--actor", "ann")
    assert resolved.code == 0, resolved.err
    with walj.ToolJournal.open(log, tools={"charge": counting(runs)}) as journal:
        with journal.turn() as turn:
            again = turn.dispatch("charge", {"order_id": "A-1"}, call_id="c1")
    if outcome == "not_performed":
        assert "the tool runs again" in said and "same idempotency key" in said
        assert len(runs) == 2 and again.outcome == "ok" and not again.replayed
        assert runs[0] == runs[1] and again.execution_id != blocker.execution_id
    else:
        answered = "ok" if outcome == "succeeded" else "error"
        assert f"answered `{answered}`" in said and "the tool does not run" in said
        assert len(runs) == 1 and again.replayed and again.outcome == answered
    if outcome == "failed":
        assert "--note" in said and "checked the ledger" in str(again.error)


def test_resolve_help_says_reviewed_is_for_cut_bytes() -> None:
    said = resolve_help()["reviewed"]
    assert "QUARANTINE_FILE" in said and "stop blocking" in said


REPOSITORY_PATH = re.compile(r"\b(docs|examples|tests|benchmarks)/|\b[\w-]+\.md\b")


def help_texts(prog: str) -> dict[str, str]:
    """`PROG --help` and every `PROG COMMAND --help`, as argparse renders them."""
    parser = build_parser(prog)
    texts = {"": parser.format_help()}
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for name, sub in action.choices.items():
            texts[name] = sub.format_help()
    return texts


@pytest.mark.parametrize("prog", ["walj", "walj-forensic.pyz"])
def test_no_help_text_names_a_repository_path(prog: str) -> None:
    texts = help_texts(prog)
    assert len(texts) > 10
    for command, text in texts.items():
        assert not REPOSITORY_PATH.search(text), (command, REPOSITORY_PATH.search(text))


def test_walj_help_says_where_the_installed_documentation_is() -> None:
    from importlib import metadata

    shown = walj_cli("--help")
    assert shown.code == 0 and "walj COMMAND --help" in shown.out
    info = metadata.metadata("walj")
    if info.get_all("Project-URL") or info["Home-page"]:  # pragma: no cover - none declared
        assert "documentation: http" in shown.out
    else:
        line = shown.out[shown.out.index("documentation: "):]
        assert f"README installed with walj {info['Version']}" in line
        where = Path(line.splitlines()[1].strip())
        assert where.name in ("METADATA", "PKG-INFO") and where.is_file()
        assert "walj" in where.read_text(encoding="utf-8")
    assert not REPOSITORY_PATH.search(shown.out)
    assert os.path.sep + "docs" + os.path.sep not in shown.out


def test_walj_help_gives_the_project_urls_the_installed_metadata_names(tmp_path: Path) -> None:
    """A walj installed with project URLs in its metadata (found first on the path here):
    `walj --help` gives them, and no README path."""
    info = tmp_path / "walj-9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: walj\nVersion: 9.9\n"
        "Project-URL: Documentation, https://docs.example.invalid/walj\n"
        "Project-URL: Source, https://code.example.invalid/walj\n", encoding="utf-8")
    # First of all: a checkout installed in editable mode has its own walj.egg-info at its root.
    env = {**ENV, "PYTHONPATH": str(tmp_path) + os.pathsep + ENV["PYTHONPATH"]}
    shown = subprocess.run([sys.executable, "-m", "walj", "--help"], env=env, timeout=60,
                           capture_output=True, text=True, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.rstrip().endswith(
        "documentation: https://docs.example.invalid/walj, https://code.example.invalid/walj")
    assert "README" not in shown.stdout
