"""Any text names a session: safe ids keep their directory name, every other id is encoded
so that no two ids share a directory and none leaves the root; the id itself is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from journal_helpers import kinds

import walj
from walj.journal import records as rc
from walj.journal._sessions import directory_name

SAFE = st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.@+=-]{0,127}\Z")
ANY_ID = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=300)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(SAFE, ANY_ID, st.text("%~./\\-a", min_size=1, max_size=220)),
                min_size=2, max_size=20, unique=True))
def test_distinct_ids_get_distinct_single_component_names(ids: list[str]) -> None:
    names = [directory_name(session_id) for session_id in ids]
    assert len(set(names)) == len(ids)
    for name in names:
        assert name not in ("", ".", "..") and "/" not in name and "\\" not in name
        assert "\x00" not in name and len(name.encode()) <= 200 and name.isascii()


@given(SAFE)
def test_safe_ids_keep_their_name(session_id: str) -> None:
    assert directory_name(session_id) == session_id


@pytest.mark.parametrize("session_id", [
    ".", "..", "../x", "../../etc", "/abs", "a/b", "a\\b", "-flag", ".hidden", "a\x00b",
    "user:42", "é", "a b", "x" * 129, "ü" * 1000,
])
def test_traversal_and_odd_ids_stay_one_directory_under_root(tmp_path: Path,
                                                            session_id: str) -> None:
    root = tmp_path / "root"
    path = walj.ToolJournal.session_path(root, session_id)
    assert path.parent == root and path.name.startswith("%")
    with walj.ToolJournal.open_session(root, session_id) as journal:
        assert journal.path == path
        assert journal.recovery.session_id == session_id == journal.session_id
    assert [p.name for p in root.iterdir()] == [path.name]
    with walj.ToolJournal.open_session(root, session_id) as journal:
        assert journal.recovery.session_id == session_id
    assert kinds(path).count(rc.SESSION_NAMED) == 1  # once, not on every open


def test_a_long_id_is_hash_suffixed(tmp_path: Path) -> None:
    long_a, long_b = "a:" * 200 + "1", "a:" * 200 + "2"
    name_a, name_b = directory_name(long_a), directory_name(long_b)
    assert name_a != name_b and "~" in name_a and len(name_a) <= 200
    assert not directory_name("a:~").count("~")  # a short form escapes it


def test_a_journal_of_another_session_is_refused(tmp_path: Path) -> None:
    with walj.ToolJournal.open_session(tmp_path, "user:42"):
        pass
    path = walj.ToolJournal.session_path(tmp_path, "user:42")
    (tmp_path / "moved").mkdir()
    path.rename(tmp_path / "moved" / directory_name("user:43"))
    with pytest.raises(ValueError, match="belongs to session 'user:42'"):
        walj.ToolJournal.open_session(tmp_path / "moved", "user:43")
    assert kinds(tmp_path / "moved" / directory_name("user:43")).count(rc.SESSION_NAMED) == 1


def test_a_journal_from_before_session_names_gets_one(tmp_path: Path) -> None:
    with walj.ToolJournal.open(tmp_path / "s1") as journal:
        assert journal.recovery.session_id is None
    with walj.ToolJournal.open_session(tmp_path, "s1") as journal:
        assert journal.recovery.session_id == "s1"


def test_inspect_shows_the_original_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from walj.cli._main import main

    session_id = "user:42\x1b[31m"
    with walj.ToolJournal.open_session(tmp_path, session_id) as journal:
        path = str(journal.path)
    assert main(["inspect", path]) == 0
    text = capsys.readouterr().out
    assert "user:42" in text and "\x1b" not in text
    assert main(["inspect", "--json", path]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "walj.inspect/3" and report["session_id"] == session_id
