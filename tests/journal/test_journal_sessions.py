"""Many sessions in one process: a thousand open journals, each holding exactly two file
descriptors (its active segment and its LOCK), all usable at once, none left after close."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest

import walj

SESSIONS = 1000
FDS_PER_JOURNAL = 2  # README.md, "Many sessions in one process"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_thousand_open_journals_in_one_process(tmp_path: Path) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < SESSIONS * FDS_PER_JOURNAL + 64:
        pytest.skip(f"ulimit -n is {soft}; the README says what to raise it to")
    before = _open_fds()
    journals = []
    try:
        for k in range(SESSIONS):
            journals.append(walj.ToolJournal.open_session(
                tmp_path, f"s{k}", tools={"echo": lambda k: k}, sync="never"))
        assert _open_fds() - before == SESSIONS * FDS_PER_JOURNAL
        for k, journal in enumerate(journals):
            with journal.turn() as turn:
                assert turn.dispatch("echo", {"k": k}).output == k
    finally:
        for journal in journals:
            journal.close()
    assert _open_fds() == before
    for k in (0, SESSIONS - 1):
        with walj.ToolJournal.open_session(tmp_path, f"s{k}") as journal:
            # session_named, turn_started, the intent, its outcome, turn_completed
            assert journal.recovery.records == 5 and not journal.recovery.blocked
            assert journal.recovery.session_id == f"s{k}"
