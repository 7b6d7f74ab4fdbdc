"""The integrations' journal holder answers another process's request to release a session's
journal: only once no run of the session is active in this process (the journal alone looks
idle between a run's turns), then forgets it, leaving no descriptor, and opens it afresh on
its next use. (Two worker processes handing a thread over by asking:
tests/integrations/test_sessions.py.)"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until

import walj
from walj.integrations._journals import JournalOnly, SessionJournals

SESSION = "user:42"


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def released(path: Path) -> list[dict[str, Any]]:
    return [r.data for r in walj.read(path) if r.data.get("kind") == "journal_released"]


def test_a_release_asked_during_a_run_waits_for_the_run_then_the_journal_is_forgotten(
    tmp_path: Path
) -> None:
    before = open_fds()
    journals = SessionJournals(tmp_path, JournalOnly, options={}, idle_timeout=None)
    path = walj.ToolJournal.session_path(tmp_path, SESSION)
    held = journals.acquire(SESSION)  # a run is active; its journal has no live turn
    # Asked by another opener (its request file; this process's lock refuses it the journal):
    # the journal looks idle to itself, yet the registry's active run keeps it open.
    asked = walj.request_release(path, actor="worker-2", wait=2.5)
    assert asked.status == "queued"
    assert not held.journal.closed and released(path) == []
    with held.journal.turn():  # the run goes on with the journal it was handed
        pass
    assert journals.get(SESSION) is held
    journals.done(SESSION, held)
    # Idle now: the journal's watcher releases it within about a second.
    assert wait_until(lambda: held.journal.closed)
    [record] = released(path)
    assert (record["request"], record["actor"]) == (asked.request_id, "worker-2")
    assert not (path / "requests").exists() or list((path / "requests").iterdir()) == []
    journals.sweep()
    assert journals.open_ids() == []
    # Opened afresh on the next use; closing the registry leaves no descriptor behind.
    again = journals.acquire(SESSION)
    assert again is not held and not again.journal.closed
    journals.done(SESSION, again)
    journals.close()
    assert open_fds() - before == set()


def test_a_released_journal_is_reopened_by_the_next_run_without_a_sweep(tmp_path: Path) -> None:
    before = open_fds()
    journals = SessionJournals(tmp_path, JournalOnly, options={}, idle_timeout=None)
    path = walj.ToolJournal.session_path(tmp_path, SESSION)
    held = journals.get(SESSION)
    assert walj.request_release(path, actor="worker-2").status == "applied"
    assert held.journal.closed
    again = journals.acquire(SESSION)
    assert again is not held and not again.journal.closed
    journals.done(SESSION, again)
    journals.close()
    assert open_fds() - before == set()


def test_release_on_request_is_the_holder_s_not_a_journal_option(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="release_on_request"):
        SessionJournals(tmp_path, JournalOnly, options={"release_on_request": False})
