"""Request files in a log directory's `requests/`: created atomically and durably, read as
hostile input (never crashing, never hanging, never read past their bound), removed only after
the answer is durable, and the order of system calls that makes each step durable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import strace_calls

import walj
from walj.errors import CorruptionError, RecordTooLargeError
from walj.log import (
    PICK_UP_LIMIT,
    REQUEST_LIMIT,
    MalformedRequestError,
    RequestWatch,
    load_request,
    pending_requests,
    post_request,
    remove_request,
)
from walj.log._requests import request_line
from walj.log.format import checksum_ok

FIELDS = {"kind": "resolve", "target": "abc", "outcome": "succeeded", "note": "n",
          "actor": "ann", "at": 1.5}
ROOT = str(Path(__file__).resolve().parents[2])


def _log(tmp_path: Path) -> Path:
    path = tmp_path / "log"
    with walj.Log.open(path) as log:
        log.append({"i": 1})
    return path


def test_post_writes_one_checksummed_line_under_a_random_id(tmp_path: Path) -> None:
    path = _log(tmp_path)
    first = post_request(path, FIELDS)
    second = post_request(path, FIELDS)
    assert first != second and len(first) == 32
    names = sorted(p.name for p in (path / "requests").iterdir())
    assert names == sorted([f"{first}.req", f"{second}.req"])  # no temp file left
    data = (path / "requests" / f"{first}.req").read_bytes()
    assert data.count(b"\n") == 1 and checksum_ok(data[:-1])
    assert json.loads(data)["request"] == {"id": first, **FIELDS}
    assert load_request(path, first) == {"id": first, **FIELDS}
    assert pending_requests(path) == sorted([first, second])
    walj.verify(path)  # the log itself is untouched by its requests/
    assert [r.data for r in walj.read(path)] == [{"i": 1}]


def test_post_refuses_a_request_over_the_bound_and_writes_nothing(tmp_path: Path) -> None:
    path = _log(tmp_path)
    with pytest.raises(RecordTooLargeError, match="request file holds at most"):
        post_request(path, {**FIELDS, "note": "x" * REQUEST_LIMIT})
    assert not (path / "requests").exists()


def test_post_refuses_a_requests_symlink_and_a_missing_log(tmp_path: Path) -> None:
    path = _log(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (path / "requests").symlink_to(elsewhere)
    with pytest.raises(CorruptionError, match="not a directory"):
        post_request(path, FIELDS)
    assert list(elsewhere.iterdir()) == []
    assert pending_requests(path) == []  # a symlinked requests/ is never listed either
    with pytest.raises(FileNotFoundError):
        post_request(tmp_path / "missing", FIELDS)
    assert not (tmp_path / "missing").exists()


def _plant(path: Path, request_id: str, data: bytes) -> None:
    (path / "requests").mkdir(exist_ok=True)
    (path / "requests" / f"{request_id}.req").write_bytes(data)


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "torn"),
    (b"garbage\n", "bad_checksum"),
    (request_line("a" * 32, FIELDS)[:-1], "torn"),  # cut before its newline
    (request_line("a" * 32, FIELDS)[:40] + b"\n", "bad_checksum"),
    (request_line("a" * 32, FIELDS) * 2, "torn"),
    (request_line("b" * 32, FIELDS), "wrong_id"),
    (request_line("a" * 32, FIELDS).replace(b"ann", b"bob"), "bad_checksum"),
    (b"x" * (REQUEST_LIMIT + 10), "too_large"),
])
def test_a_hostile_request_file_is_malformed_with_its_reason(tmp_path: Path, data: bytes,
                                                            reason: str) -> None:
    path = _log(tmp_path)
    _plant(path, "a" * 32, data)
    assert pending_requests(path) == ["a" * 32]
    with pytest.raises(MalformedRequestError) as caught:
        load_request(path, "a" * 32)
    assert caught.value.reason == reason


def test_a_request_that_is_no_json_object_is_malformed(tmp_path: Path) -> None:
    from walj.log.format import frame

    path = _log(tmp_path)
    _plant(path, "c" * 32, frame(b'"request":[1,2]}'))
    with pytest.raises(MalformedRequestError) as caught:
        load_request(path, "c" * 32)
    assert caught.value.reason == "wrong_id"
    _plant(path, "d" * 32, frame(b'"request":{"id":}'))
    with pytest.raises(MalformedRequestError) as caught:
        load_request(path, "d" * 32)
    assert caught.value.reason == "not_json"


def test_special_files_named_like_requests_are_refused_without_hanging(tmp_path: Path) -> None:
    path = _log(tmp_path)
    requests = path / "requests"
    requests.mkdir()
    target = tmp_path / "secret"
    target.write_bytes(request_line("1" * 32, FIELDS))
    (requests / f"{'1' * 32}.req").symlink_to(target)
    os.mkfifo(requests / f"{'2' * 32}.req")
    (requests / f"{'3' * 32}.req").mkdir()
    started = time.monotonic()
    reasons = []
    for request_id in pending_requests(path):
        with pytest.raises(MalformedRequestError) as caught:
            load_request(path, request_id)
        reasons.append(caught.value.reason)
    assert time.monotonic() - started < 5  # the FIFO did not block the read
    assert reasons == ["symlink", "not_a_regular_file", "not_a_regular_file"]
    for request_id in ("1" * 32, "2" * 32, "3" * 32):
        remove_request(path, request_id)
    assert pending_requests(path) == []
    assert target.exists()  # the symlink went, never what it points at
    # The directory could not be unlinked: it is moved to a name no reader opens.
    assert [p.name for p in requests.iterdir()] == [f".{'3' * 32}.unremovable"]


def test_only_names_shaped_like_requests_are_listed_and_a_pick_up_is_bounded(
        tmp_path: Path) -> None:
    path = _log(tmp_path)
    requests = path / "requests"
    requests.mkdir()
    for name in (f".{'a' * 32}.tmp", "junk", f"{'A' * 32}.req", f"{'a' * 31}.req",
                 f"{'a' * 32}.req.bak", "..req"):
        (requests / name).write_bytes(b"never read")
    assert pending_requests(path) == []
    ids = [f"{i:032x}" for i in range(PICK_UP_LIMIT + 5)]
    for request_id in ids:
        (requests / f"{request_id}.req").write_bytes(b"")
    assert pending_requests(path) == ids[:PICK_UP_LIMIT]
    assert pending_requests(path, 3) == ids[:3]
    assert load_request(path, "f" * 32) is None  # gone: nothing to answer


def test_the_watch_looks_when_the_directory_changes_or_its_time_is_too_recent(
        tmp_path: Path) -> None:
    path = _log(tmp_path)
    watch = RequestWatch(path)
    assert not watch.due()  # no requests/: one failed lstat, nothing listed
    post_request(path, FIELDS)
    requests = path / "requests"
    assert watch.due()
    assert watch.due()  # listed within the coarse window after the change: look again
    old = time.time() - 60
    os.utime(requests, (old, old))
    assert watch.due()  # changed (its time)
    assert not watch.due()  # nothing changed since a listing well after the last change
    post_request(path, FIELDS)
    assert watch.due()
    os.utime(requests, (old, old))
    assert watch.due()
    assert not watch.due()
    watch.retry()
    assert watch.due()  # the last pick-up left requests behind


STRACE = shutil.which("strace")
POSTER = textwrap.dedent("""
    import sys
    from walj.log import post_request
    post_request(sys.argv[1], {"kind": "resolve", "target": "x", "actor": "ann", "at": 1.0})
""")


def _strace(tmp_path: Path, script: str, *args: str) -> list[tuple[str, str]]:
    out = tmp_path / "trace"
    subprocess.run(
        [str(STRACE), "-f", "-qq", "-o", str(out), "-e",
         "trace=openat,write,pwrite64,fdatasync,fsync,rename,unlink,unlinkat",
         sys.executable, "-c", script, *args],
        check=True, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True)
    return strace_calls(out.read_text())


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_syscall_order_of_posting_a_request(tmp_path: Path) -> None:
    """The temp file is written and fdatasynced before its rename, and the directory is
    fsynced after the rename: once post returns, the request survives a crash."""
    path = _log(tmp_path)
    (path / "requests").mkdir()
    requests = str(path / "requests")
    events = [(op, os.path.basename(t) if t != requests else "DIR")
              for op, t in _strace(tmp_path, POSTER, str(path))
              if t.startswith(requests)]
    ops = [op for op, _ in events]
    tmp = next(t for op, t in events if op == "openat" and t.endswith(".tmp"))
    final = tmp[1:-len(".tmp")] + ".req"
    assert events[ops.index("write"):] == [
        ("write", tmp), ("fdatasync", tmp), ("rename", final), ("openat", "DIR"),
        ("fsync", "DIR")], events


APPLIER = textwrap.dedent("""
    import sys, walj
    journal = walj.ToolJournal.open(sys.argv[1])
    journal.close()
""")


@pytest.mark.skipif(STRACE is None, reason="strace is not installed")
def test_syscall_order_of_answering_a_request(tmp_path: Path) -> None:
    """The writer's answer (a resolution_refused here) is written and fdatasynced to the
    segment before the request file is unlinked, and the requests directory is fsynced
    after the unlink."""
    path = tmp_path / "journal"
    walj.ToolJournal.open(path).close()
    request_id = post_request(path, FIELDS)
    requests = str(path / "requests")
    events = [(op, os.path.basename(t) if t != requests else "DIR")
              for op, t in _strace(tmp_path, APPLIER, str(path))
              if t.startswith(str(path))]
    unlink = events.index(("unlink", f"{request_id}.req"))
    before = events[:unlink]
    last_write = max(i for i, (op, t) in enumerate(before) if op == "write"
                     and t.startswith("seg-"))
    assert any(op == "fdatasync" and t.startswith("seg-") for op, t in before[last_write:])
    assert events[unlink + 1:unlink + 3] == [("openat", "DIR"), ("fsync", "DIR")], events
    (record,) = [r.data for r in walj.read(path) if r.data.get("request") == request_id]
    assert record["kind"] == "resolution_refused" and record["reason"] == "unknown"


def test_temp_files_of_killed_posts_are_removed_once_stale(tmp_path: Path) -> None:
    from walj.log import remove_stale_requests

    path = _log(tmp_path)
    requests = path / "requests"
    requests.mkdir()
    stale, fresh = requests / f".{'a' * 32}.tmp", requests / f".{'b' * 32}.tmp"
    stray = requests / f".{'c' * 32}.tmp.keep"
    for p in (stale, fresh, stray):
        p.write_bytes(b"half a request")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    os.utime(stray, (old, old))
    assert remove_stale_requests(path) == 1
    assert sorted(p.name for p in requests.iterdir()) == sorted([fresh.name, stray.name])
    os.utime(fresh, (old, old))
    walj.ToolJournal.open(tmp_path / "j").close()
    (tmp_path / "j" / "requests").mkdir()
    shutil.copy2(fresh, tmp_path / "j" / "requests" / fresh.name)
    walj.ToolJournal.open(tmp_path / "j").close()  # an open sweeps them
    assert list((tmp_path / "j" / "requests").iterdir()) == []
