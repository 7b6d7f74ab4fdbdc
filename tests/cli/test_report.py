"""`walj report`: one self-contained HTML page of every session, blocked first, with the
resolve command `walj inspect` gives for each blocker and the verification of every segment;
read-only beside a live writer; on archives (file:// and S3) and archive plus local tail;
every string from a log escaped; bounded in size for many sessions."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from archive_helpers import Archive
from cli_helpers import (
    ENV,
    assert_one_line_error,
    make_journal,
    snapshot,
    walj_cli,
)
from report_helpers import (
    ACTOR,
    IMG_CALL,
    NOTE,
    SCRIPT_TOOL,
    TAGS,
    UNSAFE,
    blocked_root,
    hostile_session,
    read_page,
)

import walj
import walj.archive
from walj.cli import main
from walj.cli._common import printable
from walj.cli._inspect import resolve_command
from walj.cli._report_detail import ARCHIVED_SESSION, TURNS


def _blockers(path: Path) -> list[walj.journal.Blocker]:
    """The session's blockers as the journal's own rebuild gives them (read-only)."""
    from walj.journal.state import rebuild
    from walj.log.scan import LogScan

    return list(rebuild(LogScan(str(path), mode="salvage")).snapshot().blockers)


def test_report_of_a_root_lists_blocked_first_with_inspects_resolve_commands(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    eid = blocked_root(root)["eid"]
    (root / "link").symlink_to(root / "clean")  # listed, never followed, as by `sweep`
    before = snapshot(root)
    out = tmp_path / "report.html"
    run = walj_cli("report", root, "-o", out)
    assert run.code == 1, run.err  # blocked and corrupt sessions: problems, as `sweep`
    assert run.out.startswith(f"{out}: 5 sessions") and "5 in full" in run.out
    assert snapshot(root) == before  # nothing written, no lock taken, no request left
    raw, page = read_page(out)
    statuses = ["blocked", "blocked", "corrupt", "unreadable", "active"]
    assert [row[0] for row in page.rows] == statuses
    assert [status for _, status in page.sections] == statuses
    assert "symlink to" in page.rows[3][-1] and page.rows[3][1] == "link"
    assert {row[1] for row in page.rows[:2]} == {"blocked", "turn"}
    # Each blocker's command is the one function's, the one `walj inspect` prints.
    by_name = {row[1]: section for row, (section, _) in zip(page.rows, page.sections,
                                                             strict=True)}
    for name in ("blocked", "turn"):
        expected = [resolve_command(str(root / name), b) for b in _blockers(root / name)]
        assert page.commands[by_name[name]] == expected
        inspect = walj_cli("inspect", root / name)
        assert inspect.code == 1 and all(f"  {c}\n" in inspect.out for c in expected)
    assert eid in page.commands[by_name["blocked"]][0]
    assert "--turn 3 --note TEXT --actor NAME" in page.commands[by_name["turn"]][0]
    text = "".join(page.text)
    assert "bad_checksum" in text and "BROKEN" not in text.split("corrupt")[0]
    assert text.count("Seal chain: verified") == 4  # a flipped byte breaks a line, not a seal
    assert "cannot be read: refused: symlink to" in text  # its section read nothing
    assert "RuntimeError: quota exceeded" in text and '{"order_id":"A-1"}' in text
    assert "http" not in raw.replace("http-equiv", "")  # nothing fetched: no URL at all
    # Only the clean one: exit 0.
    clean = walj_cli("report", root / "clean", "-o", tmp_path / "clean.html")
    assert clean.code == 0, clean.err
    assert_one_line_error(walj_cli("report", tmp_path / "nothing", "-o", out), 2,
                          "no such file")
    assert_one_line_error(walj_cli("report", root, "-o", tmp_path / "no" / "r.html"), 2,
                          "no such directory")
    for inside in (root / "clean" / "r.html", root / "turn" / "quarantine" / "r.html"):
        inside.parent.mkdir(exist_ok=True)
        assert_one_line_error(walj_cli("report", root, "-o", inside), 2, "inside the session")
        assert not inside.exists()


def test_every_string_from_the_log_is_escaped(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    path, blocker = hostile_session(root)
    out = tmp_path / "report.html"
    assert main(["report", str(root), "-o", str(out), "--jobs", "1"]) == 1
    assert UNSAFE.search(capsys.readouterr().out) is None
    raw, page = read_page(out)
    assert UNSAFE.search(raw) is None  # no control character reaches the page raw
    assert page.tags <= TAGS  # no element a log added: no <script>, no <img>
    assert not any(name.startswith("on") for name in page.attributes)
    text = "".join(page.text)
    for hostile in (SCRIPT_TOOL, IMG_CALL, ACTOR, "window.__walj_pwned = 6",
                    '<img src=x onerror="window.__walj_pwned = 7">',
                    "</pre><script>window.__walj_pwned = 5</script>"):
        assert hostile in text, hostile  # shown as text, whole
    # Control characters are shown as the terminal views show them.
    assert "\\x1b]52;c;ZWNobyBvd25lZA==\\x07\\x9b2J\\u202e\\x00\\x0a" in text
    assert "onerror='window.__walj_pwned=3'>\\x1b[2J" in text  # the directory's name
    # The command as `walj inspect` prints it: its control characters shown, not written.
    assert NOTE.startswith("</pre>") and page.commands[page.sections[0][0]] == [
        printable(resolve_command(str(path), b)) for b in _blockers(path)]
    assert blocker in page.commands[page.sections[0][0]][0]


def test_report_bounds_its_size_for_many_sessions(tmp_path: Path) -> None:
    """Copies of one session (quick to make): a summary row for each beyond --detail, and a
    session in full shows only its last TURNS turns."""
    root = tmp_path / "root"
    make_journal(root / "s0000", turns=TURNS + 5)
    count = 300
    for i in range(1, count):
        shutil.copytree(root / "s0000", root / f"s{i:04d}")
    one, many = tmp_path / "one.html", tmp_path / "many.html"
    assert walj_cli("report", root / "s0000", "-o", one).code == 0
    run = walj_cli("report", root, "-o", many, "--detail", "3", "--jobs", "2")
    assert run.code == 0, run.err
    _, page = read_page(many)
    assert len(page.rows) == count and len(page.sections) == 3
    text = "".join(read_page(one)[1].text)
    assert f"the last {TURNS} of {TURNS + 5}" in text and f"turn {TURNS + 5} " in text
    assert "turn 5 " not in text
    # Three sessions in full (each as large as the one alone, its path aside), and a row of
    # at most 400 bytes for each of the others.
    full = one.stat().st_size
    assert many.stat().st_size <= 3 * full + count * 400
    assert many.stat().st_size >= count * 150  # every row is there


WRITER = textwrap.dedent("""
    import sys, walj
    journal = walj.ToolJournal.open(sys.argv[1], tools={"lookup": lambda order_id: "x" * 300},
                                    sync="never", segment_bytes=4096)
    n = 0
    while True:
        with journal.turn() as turn:
            turn.dispatch("lookup", {"order_id": f"A-{n}"})
        n += 1
        if n == 30:
            print("ready", flush=True)
""")


def test_report_beside_a_live_writer(tmp_path: Path) -> None:
    log = tmp_path / "root" / "live"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log)], env=ENV,
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    try:
        assert writer.stdout.readline().strip() == "ready"
        for i in range(3):
            run = walj_cli("report", log.parent, "-o", tmp_path / f"r{i}.html")
            # The writer's call in flight may look like a blocker, as in `walj inspect`.
            assert run.code in (0, 1), run.err
            text = "".join(read_page(tmp_path / f"r{i}.html")[1].text)
            assert "Seal chain: verified" in text and "Problems (" not in text
        assert writer.poll() is None  # it kept its lock and went on writing
    finally:
        writer.kill()
        writer.wait()


def test_report_over_an_archive_and_an_archive_with_its_local_tail(
        archive: Archive, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    make_journal(root / "blocked", blocked=True, segment_bytes=1024)
    make_journal(root / "clean", segment_bytes=1024)
    for name in ("blocked", "clean"):
        walj.Log.open(root / name, max_record_bytes=131072).close()  # seal the last segment
        assert walj.archive.ship(root / name, archive.url).shipped
    out = tmp_path / "archive.html"
    capsys.readouterr()
    assert main(["report", archive.url, "-o", str(out)]) == 1
    _, page = read_page(out)
    ids = {name: walj.verify(root / name).log_id for name in ("blocked", "clean")}
    assert [row[1] for row in page.rows] == [ids["blocked"], ids["clean"]]
    assert [row[0] for row in page.rows] == ["blocked", "active"]
    (blocker,) = _blockers(root / "blocked")
    assert page.commands[page.sections[0][0]] == [resolve_command(ARCHIVED_SESSION, blocker)]
    one = f"{archive.url}/{ids['blocked']}"  # one archived session's URL
    assert main(["report", one, "-o", str(out)]) == 1
    assert [(row[0], row[1]) for row in read_page(out)[1].rows] == [("blocked", one)]
    # Archive plus the local tail: older local segments gone, the chain checked across.
    for segment in sorted((root / "clean").glob("seg-*.jsonl"))[:-1]:
        segment.unlink()
    alone = main(["report", str(root / "clean"), "-o", str(out)])
    assert alone == 1  # alone, the tail chains to a seal that is not there
    assert main(["report", str(root / "clean"), "--archive", archive.url, "-o", str(out)]) == 0
    text = "".join(read_page(out)[1].text)
    assert "archive + local" in text and "Seal chain: verified" in text
    assert main(["report", archive.url, "--archive", archive.url, "-o", str(out)]) == 2
    assert main(["report", str(root), "--archive", archive.url + "-typo", "-o", str(out)]) == 2
    assert "holds no archived session" in capsys.readouterr().err


def test_report_shows_approvals_pending_first_with_who_decided(tmp_path: Path) -> None:
    """A pending request blocks nothing (exit 0); each request shows what came of it: pending,
    denied (by whom, why), consumed by the run it allowed, approved with its expiry."""
    path = tmp_path / "root" / "approvals"
    tools = {"send": walj.Tool(lambda to: f"sent to {to}", approval=True)}
    with walj.ToolJournal.open(path, tools=tools, sync="never") as journal:
        def ask(call_id: str, to: str) -> walj.ToolResult:
            with journal.turn() as turn:
                return turn.dispatch("send", {"to": to}, call_id=call_id)

        ids = {call: ask(call, f"{call}@example.com").approval_id for call in "abcd"}
        journal.approve(ids["a"], actor="ann", note="checked the address")
        assert ask("a", "a@example.com").outcome == "ok"
        journal.deny(ids["b"], actor="bob", note="<b>not this one</b>")
        journal.approve(ids["c"], actor="ann", expires_at=time.time() + 3600)
    out = tmp_path / "report.html"
    run = walj_cli("report", path.parent, "-o", out)
    assert run.code == 0, run.err  # nothing blocks: pending and decided requests alike
    _, page = read_page(out)
    text = "".join(page.text)
    assert "Approvals (4, 1 pending)" in text
    rows = text.split("Approvals (4, 1 pending)")[1]
    assert rows.index(str(ids["d"])) < min(rows.index(str(ids[c])) for c in "abc")
    for call, status in (("a", "consumed"), ("b", "denied"), ("c", "approved"), ("d", "pending")):
        row = rf'{ids[call]}send{call}\{{"to":"{call}@example.com"\}}[0-9: -]+{status}'
        assert re.search(row, rows), call
    assert "bob: <b>not this one</b>" in text and "ann: checked the address" in text
    # Each turn's timeline names the approval its call asked for: nothing ran there.
    assert f"asked for approval {ids['b']} (now denied); nothing ran" in text


def test_an_interrupted_report_leaves_the_old_page_or_a_whole_new_one(tmp_path: Path) -> None:
    """A real Ctrl-C (SIGINT) at moments spread over the run: never half a page, never its
    temporary file left behind; the page before stays until a whole one replaces it."""
    root = tmp_path / "root"
    make_journal(root / "s000", turns=TURNS + 5)
    for i in range(1, 120):
        shutil.copytree(root / "s000", root / f"s{i:03d}")
    out = tmp_path / "pages" / "report.html"
    out.parent.mkdir()
    out.write_text("the page before")
    codes = set()
    for delay in (0.3, 0.5, 0.8):
        child = subprocess.Popen(
            [sys.executable, "-m", "walj", "report", str(root), "-o", str(out), "--jobs", "1",
             "--detail", "120"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
        codes.add(child.returncode)
        assert child.returncode in (0, 130, -signal.SIGINT), err
        assert [p.name for p in out.parent.iterdir()] == ["report.html"]  # no temporary file
        page = out.read_text(encoding="utf-8")
        assert page == "the page before" or (page.endswith("</html>\n")
                                             and len(read_page(out)[1].rows) == 120)
    assert codes & {130, -signal.SIGINT}  # at least one run was cut short
    assert walj_cli("report", root, "-o", out, "--detail", "1").code == 0  # then a whole one
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]
    assert len(read_page(out)[1].rows) == 120
