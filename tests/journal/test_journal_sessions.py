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


def _open_fds(under: Path) -> int:
    """This process's descriptors of files under `under`: the journals' own, whatever else
    the process (another test's leftovers, collected meanwhile) opens or closes."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing
            continue
        count += target.startswith(f"{under}{os.sep}")
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_thousand_open_journals_in_one_process(tmp_path: Path) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < SESSIONS * FDS_PER_JOURNAL + 64:
        pytest.skip(f"ulimit -n is {soft}; the README says what to raise it to")
    assert _open_fds(tmp_path) == 0
    journals = []
    try:
        for k in range(SESSIONS):
            journals.append(walj.ToolJournal.open_session(
                tmp_path, f"s{k}", tools={"echo": lambda k: k}, sync="never"))
        assert _open_fds(tmp_path) == SESSIONS * FDS_PER_JOURNAL
        for k, journal in enumerate(journals):
            with journal.turn() as turn:
                assert turn.dispatch("echo", {"k": k}).output == k
    finally:
        for journal in journals:
            journal.close()
    assert _open_fds(tmp_path) == 0
    for k in (0, SESSIONS - 1):
        with walj.ToolJournal.open_session(tmp_path, f"s{k}") as journal:
            # session_named, turn_started, the intent, its outcome, turn_completed
            assert journal.recovery.records == 5 and not journal.recovery.blocked
            assert journal.recovery.session_id == f"s{k}"
