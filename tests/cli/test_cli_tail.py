"""`walj tail -f` follows records appended by another writer across segment rotations, and
stops cleanly (exit 0) on Ctrl-C."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import ENV, REPO, make_plain_log
from helpers import segments

import walj

DEADLINE = 60.0  # a guard against a hang, not a timing assertion


class Lines:
    """The child's stdout lines, read by a thread (select() cannot see a text buffer)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        self.thread = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self.thread.start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.queue.put(line)
        self.queue.put("")

    def next(self) -> str:
        try:
            line = self.queue.get(timeout=DEADLINE)
        except queue.Empty:
            raise AssertionError("tail -f printed nothing more") from None
        assert line, "tail -f exited early"
        return line

    def until(self, last_seq: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        while not rows or rows[-1]["seq"] != last_seq:
            rows.append(json.loads(self.next()))
        return rows


def test_tail_follows_across_rotation_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 1, segment_bytes=1024)
    proc = subprocess.Popen(
        [sys.executable, "-m", "walj", "tail", "-f", "--from-seq", "1", "--json",
         "--interval", "0.02", str(log)],
        env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = Lines(proc)
        first = lines.until(1)  # the initial read is done: what follows is followed
        assert [r["seq"] for r in first] == [1]
        segments_before = len(segments(log))
        with walj.Log.open(log, segment_bytes=1024, sync="never") as writer:
            for i in range(1, 300):
                writer.append({"i": i, "pad": "p" * 40})
        rows = lines.until(300)
        assert len(segments(log)) - segments_before >= 10  # many rotations were crossed
        assert [r["seq"] for r in rows] == list(range(2, 301))
        assert [r["data"]["i"] for r in rows] == list(range(1, 300))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE) == 0
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_tail_follow_text_view_and_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "walj", "tail", "-f", "-n", "2", "--interval", "0.02", str(log)],
        env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = Lines(proc)
        assert lines.next().split()[:2] == ["SEQ", "TIME"]
        assert lines.next().split()[0] == "2"
        assert lines.next().split()[0] == "3"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# The follower itself, on real files: it reads with the log's own segment reader, resumed
# where the last poll stopped.

def _follower_at_end(log: Path) -> tuple[Any, int]:
    from walj.cli._records import Follower

    last = max(r.seq for r in walj.read(log))
    follower = Follower(str(log), 1, 1)
    assert [seq for seq, _ in follower.poll()] == list(range(1, last + 1))
    return follower, last


def _line(seq: int) -> bytes:
    from walj.log import format as fmt

    return fmt.frame_record(seq, fmt.encode_record({"i": seq, "text": "appended"}))


def test_follower_waits_on_a_line_being_written_and_shows_it_once_complete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 5)
    follower, last = _follower_at_end(log)
    line = _line(last + 1)
    with open(segments(log)[-1], "ab") as f:
        f.write(line[:20])
        f.flush()
        assert follower.poll() == []  # incomplete: waited on, never shown
        f.write(line[20:])
    [(seq, data)] = follower.poll()
    assert seq == last + 1 and json.loads(data)["text"] == "appended"
    assert follower.poll() == []  # never shown twice
    assert capsys.readouterr().err == ""  # a write in progress is no warning


def test_follower_warns_once_at_a_line_that_does_not_verify_and_shows_nothing_past_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 5)
    follower, last = _follower_at_end(log)
    seg = segments(log)[-1]
    at = seg.stat().st_size
    bad = bytearray(_line(last + 1))
    bad[30] ^= 1
    with open(seg, "ab") as f:
        f.write(bytes(bad) + _line(last + 2))
    assert follower.poll() == [] and follower.poll() == []
    err = capsys.readouterr().err
    assert err.count("does not verify; waiting there") == 1
    assert f"{seg.name} at byte {at}" in err


def test_follower_resumes_after_a_writer_cut_the_segment_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log"
    make_plain_log(log, 8)
    follower, last = _follower_at_end(log)
    seg = segments(log)[-1]
    lines = seg.read_bytes().split(b"\n")[:-1]
    kept = b"".join(line + b"\n" for line in lines[:-2])  # the last two records cut away
    seg.write_bytes(kept)
    assert follower.poll() == []
    assert f"was cut back to seq {last - 2} after a crash" in capsys.readouterr().err
    with open(seg, "ab") as f:  # rewritten by the reopened writer, then one more
        f.write(_line(last - 1) + _line(last) + _line(last + 1))
    assert [seq for seq, _ in follower.poll()] == [last - 1, last, last + 1]
