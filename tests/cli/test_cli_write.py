"""The commands that write: `resolve` (durable with who and why, applied by a live writer that
holds the session), `repair` (refused while a live writer holds the lock; bytes moved to
quarantine, none lost) and `demo`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import (
    ENV,
    assert_one_line_error,
    flip_byte,
    make_journal,
    make_plain_log,
    record_offset,
    walj_cli,
)
from helpers import segments

HOLDER = textwrap.dedent("""
    import sys, time, walj
    journal = walj.ToolJournal.open(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
""")


def test_resolve_applied_by_the_live_writer_and_repair_refused(tmp_path: Path) -> None:
    log = tmp_path / "session"
    eid = make_journal(log, blocked=True)
    assert eid is not None
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(log)], env=ENV,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        run = walj_cli("resolve", log, eid, "--outcome", "not_performed", "--note",
                       "the mail server has no such message", "--actor", "ann", "--json")
        assert run.code == 0, run.err
        report = run.json()
        assert report["schema"] == "walj.resolve/1" and report["status"] == "applied"
        assert len(report["request_id"]) == 32
        assert report["blocked"] is False and report["blockers_left"] == 0
        assert report["resolution"]["execution_id"] == eid
        assert report["resolution"]["tool"] == "send"
        repair = walj_cli("repair", log)
        assert_one_line_error(repair, 1, "live writer", f"pid {holder.pid}")
        assert holder.poll() is None  # settled without stopping the writer
        # Settled once: by the whole id and by a prefix, the same answer from the live writer.
        for given in (eid, eid[:8]):
            again = walj_cli("resolve", log, given, "--outcome", "succeeded", "--note", "x",
                             "--actor", "bob")
            assert_one_line_error(again, 1, "already resolved", "live writer")
    finally:
        holder.kill()  # SIGKILL: the OS releases the lock with the process
        holder.wait()
    assert not (log / "requests").exists() or not list((log / "requests").iterdir())
    after = walj_cli("inspect", log, "--json")
    assert after.code == 0
    state = after.json()
    assert state["blocked"] is False
    (resolution,) = state["resolutions"]
    assert resolution["actor"] == "ann" and resolution["outcome"] == "not_performed"
    assert resolution["note"] == "the mail server has no such message"
    assert resolution["execution_id"] == eid and resolution["tool"] == "send"
    text = walj_cli("inspect", log)
    assert "ann" in text.out and "the mail server has no such message" in text.out
    for given in (eid, eid[:8]):  # no writer now: resolved directly, the same answer
        again = walj_cli("resolve", log, given, "--outcome", "succeeded", "--note", "x",
                         "--actor", "bob")
        assert_one_line_error(again, 1, "already resolved")


def test_resolve_by_prefix_turn_form_and_bad_input(tmp_path: Path) -> None:
    log = tmp_path / "session"
    make_journal(log, interrupted_turn=True, turns=1)
    state = walj_cli("inspect", log, "--json").json()
    (blocker,) = state["blockers"]
    assert blocker["state"] == "interrupted_turn"
    turn = str(blocker["turn_sequence"])
    assert_one_line_error(walj_cli("resolve", log, "--turn", turn, "--outcome", "succeeded",
                                   "--note", "n", "--actor", "a"), 2, "--outcome")
    assert_one_line_error(walj_cli("resolve", log, "--turn", "99", "--note", "n",
                                   "--actor", "a"), 2, "unknown turn")
    assert_one_line_error(walj_cli("resolve", log, "f" * 32, "--outcome", "succeeded",
                                   "--note", "n", "--actor", "a"), 2, "unknown execution id")
    assert_one_line_error(walj_cli("resolve", log, "--turn", turn, "--actor", "a"), 2, "--note")
    assert_one_line_error(walj_cli("resolve", log, "--note", "n", "--actor", "a"), 2,
                          "EXECUTION_ID or --turn")
    plain = tmp_path / "plain"
    make_plain_log(plain, 3)
    assert_one_line_error(walj_cli("resolve", plain, "--turn", "1", "--note", "n",
                                   "--actor", "a"), 2, "not a tool journal")
    run = walj_cli("resolve", log, "--turn", turn, "--note", "the reply was sent by hand",
                   "--actor", "ops")
    assert run.code == 0, run.err
    assert "no blocker left" in run.out
    assert walj_cli("inspect", log, "--json").json()["blocked"] is False

    other = tmp_path / "other"
    eid = make_journal(other, blocked=True, turns=1)
    assert eid is not None
    run = walj_cli("resolve", other, eid[:8], "--outcome", "succeeded", "--note",
                   "seen in the outbox", "--actor", "ann")
    assert run.code == 0, run.err
    assert eid in run.out
    assert_one_line_error(walj_cli("resolve", other, eid, "--outcome", "failed",
                                   "--note", " ", "--actor", "ann"), 2, "needs a note")
    assert_one_line_error(walj_cli("resolve", other, eid, "--outcome", "failed",
                                   "--note", "bounced", "--actor", "ann"), 1, "already resolved")


# --- repair ---------------------------------------------------------------------------------


def _manifest(log: Path) -> list[dict[str, object]]:
    lines = (log / "quarantine" / "MANIFEST.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_repair_torn_tail_moves_bytes_and_loses_none(tmp_path: Path) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 30)
    last = segments(log)[-1]
    with open(last, "ab") as f:
        f.write(b'{"xxh64":"0123456789abcdef","seq":31,"data":{"half')
    original = last.read_bytes()
    dry = walj_cli("repair", log, "--dry-run", "--json")
    assert dry.code == 0, dry.err
    plan = dry.json()
    assert plan["schema"] == "walj.repair/1" and plan["dry_run"] is True
    (cut,) = plan["cuts"]
    assert cut["kind"] == "incomplete_line" and cut["quarantine_file"] is None
    assert last.read_bytes() == original and not (log / "quarantine").exists()
    run = walj_cli("repair", log, "--json")
    assert run.code == 0, run.err
    report = run.json()
    assert report["ok_after"] is True
    (cut,) = report["cuts"]
    quarantined = (log / cut["quarantine_file"]).read_bytes()
    assert last.read_bytes() + quarantined == original
    assert cut["offset"] == len(last.read_bytes()) and cut["length"] == len(quarantined)
    (entry,) = _manifest(log)
    assert entry["segment"] == last.name and entry["offset"] == cut["offset"]
    assert walj_cli("verify", log, "--strict").code == 0
    assert [r["seq"] for r in walj_cli("dump", log, "--json").lines()] == list(range(1, 31))
    again = walj_cli("repair", log)
    assert again.code == 0 and "nothing to repair" in again.out


def test_repair_damaged_suffix_across_segments(tmp_path: Path) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 300, segment_bytes=4096)
    segs = segments(log)
    assert len(segs) >= 4
    damaged = segs[1]
    flip_byte(damaged, record_offset(damaged, b'"pad":"xxxxxxxxxx'))
    originals = {p.name: p.read_bytes() for p in segs}
    assert walj_cli("verify", log).code == 1
    run = walj_cli("repair", log, "--json")
    assert run.code == 0, run.err
    report = run.json()
    assert report["ok_after"] is True
    cuts = {c["segment"]: c for c in report["cuts"]}
    assert set(cuts) == {p.name for p in segs[1:]}
    assert [c["segment"] for c in report["cuts"]] == [p.name for p in reversed(segs[1:])]
    for name, data in originals.items():
        kept = (log / name).read_bytes() if (log / name).exists() else b""
        moved = (log / cuts[name]["quarantine_file"]).read_bytes() if name in cuts else b""
        assert kept + moved == data, name  # not a byte lost
    assert cuts[segs[1].name]["kind"] == "bad_checksum" and cuts[segs[1].name]["offset"] > 0
    assert all(cuts[p.name]["offset"] == 0 for p in segs[2:])
    assert not any((log / p.name).exists() for p in segs[2:])
    assert len(_manifest(log)) == len(cuts)
    verify = walj_cli("verify", log, "--json").json()
    assert verify["ok"] is True and verify["torn_tail"] is None
    assert len(verify["quarantine"]) == len(cuts)
    seqs = [r["seq"] for r in walj_cli("dump", log, "--json").lines()]
    assert seqs == list(range(1, len(seqs) + 1)) and 0 < len(seqs) < 300
    # the writer carries on from the repaired log
    import walj

    with walj.Log.open(log) as writer:
        assert writer.append({"after": "repair"}) == len(seqs) + 1


def test_repair_refuses_a_newer_format(tmp_path: Path) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 3)
    seg = segments(log)[0]
    header, rest = seg.read_bytes().split(b"\n", 1)
    from walj.log import format

    body = header[format.BODY_START:].replace(b'"v":1', b'"v":7', 1)
    seg.write_bytes(format.frame(body) + rest)  # a valid line from a newer walj
    before = seg.read_bytes()
    verify = walj_cli("verify", log, "--json")
    assert verify.code == 1
    assert verify.json()["problems"][0]["kind"] == "unsupported_version"
    assert_one_line_error(walj_cli("repair", log), 1, "format version")
    assert seg.read_bytes() == before


# --- demo -----------------------------------------------------------------------------------


def test_demo(tmp_path: Path) -> None:
    target = tmp_path / "demo"
    run = walj_cli("demo", target)
    assert run.code == 0, run.err
    out = run.out
    assert f"directory: {target}" in out
    for step in ("1. The agent runs", "SIGKILL", "2. The agent restarts",
                 "outcome 'blocked'; the handler was not called", "3. What an operator sees",
                 "BLOCKED by 1 blocker", "4. The operator", "no blocker left",
                 "5. Dispatch resumes", "outcome 'ok'", "holds 2 emails"):
        assert step in out, step
    log = target / "session"
    state = walj_cli("inspect", log, "--json").json()
    assert state["blocked"] is False
    (resolution,) = state["resolutions"]
    assert resolution["actor"] == "demo-operator" and resolution["tool"] == "send_refund_email"
    assert len((target / "outbox.jsonl").read_text().splitlines()) == 2
    timeline = walj_cli("timeline", log, "--json").json()
    blocked = [r for t in timeline["turns"] for r in t["blocked"]]
    assert len(blocked) == 1 and blocked[0]["tool"] == "send_refund_email"
    assert blocked[0]["outcome"] == "blocked"
    assert_one_line_error(walj_cli("demo", target), 2, "already holds a demo")


def test_demo_default_directory_is_new_and_printed() -> None:
    run = walj_cli("demo")
    assert run.code == 0, run.err
    line = next(x for x in run.out.splitlines() if x.startswith("directory: "))
    where = Path(line.removeprefix("directory: "))
    try:
        assert (where / "session").is_dir() and (where / "outbox.jsonl").is_file()
    finally:
        import shutil

        shutil.rmtree(where)


@pytest.mark.parametrize("command", ["resolve", "repair"])
def test_write_commands_need_a_log(tmp_path: Path, command: str) -> None:
    extra = ["x" * 8, "--outcome", "succeeded"] if command == "resolve" else []
    notes = ["--note", "n", "--actor", "a"] if command == "resolve" else []
    run = walj_cli(command, tmp_path / "missing", *extra, *notes)
    assert_one_line_error(run, 2, "no such file")
    assert not (tmp_path / "missing").exists()
