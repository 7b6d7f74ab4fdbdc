"""The CLI's model of a journal (walj/cli/_model.py): the one rebuild the commands share, and the
one place the CLI reaches the journal's private modules; from the log it takes declared names
only."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import walj
from walj.cli._model import JournalState, rebuild
from walj.errors import UnsupportedVersionError

CLI = Path(walj.__file__).resolve().parent / "cli"


def cli_imports() -> list[tuple[str, str, list[str], int]]:
    """(file, module imported, names taken, line) for every import of walj in walj/cli,
    relative ones resolved, those inside functions included."""
    found = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = ["walj", "cli"][: 3 - node.level] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if target.startswith("walj"):
                found.append((path.name, target, [a.name for a in node.names], node.lineno))
    return found


def declared(module: str, name: str) -> bool:
    """`name` is in the module's __all__, or is a public submodule of it with an __all__."""
    if name in getattr(importlib.import_module(module), "__all__", ()):
        return True
    try:
        sub = importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return not name.startswith("_") and hasattr(sub, "__all__")


def test_the_cli_takes_from_the_log_only_declared_names() -> None:
    """Only walj.log or a public submodule of it, and only the names it declares."""
    wrong = [f"{file}:{line} {target} {names}" for file, target, names, line in cli_imports()
             if (target == "walj.log" or target.startswith("walj.log."))
             and ("._" in target or not all(declared(target, n) for n in names))]
    assert wrong == []


def test_only_the_model_imports_private_journal_modules() -> None:
    wrong = [f"{file}:{line} {target}" for file, target, _, line in cli_imports()
             if target.startswith("walj.journal._") and file != "_model.py"]
    assert wrong == []


def record(seq: int, data: bytes) -> tuple[int, bytes]:
    return seq, data


def test_rebuild_stops_at_a_refused_record_and_leaves_the_rest() -> None:
    """sweep goes on scanning after the journal refuses a record (to count the log's own
    problems): the records after it must still be there, unfed."""
    records = iter([
        record(1, b'{"kind":"turn_started","version":5,"turn_sequence":1,"at":1.5}'),
        record(2, b'{"kind":"turn_completed","version":99,"turn_sequence":1,"at":2.5}'),
        record(3, b'{"kind":"turn_started","version":5,"turn_sequence":2,"at":3.5}'),
    ])
    done = rebuild(records)
    assert isinstance(done.refusal, UnsupportedVersionError)
    assert (done.seq, done.plain, done.state.records) == (2, False, 1)
    assert [seq for seq, _ in records] == [3]


def test_rebuild_takes_a_plain_log_first_record_only() -> None:
    records = iter([record(1, b'{"n":1}'), record(2, b'{"n":2}')])
    done = rebuild(records)
    assert (done.plain, done.seq, done.refusal, done.state.records) == (True, 1, None, 0)
    assert [seq for seq, _ in records] == [2]


def test_rebuild_gives_each_decoded_record_to_also_after_the_state_took_it() -> None:
    state = JournalState()
    seen: list[tuple[int, Any, int]] = []
    done = rebuild(iter([
        record(1, b'{"kind":"turn_started","version":5,"turn_sequence":1,"at":1.5}'),
        record(2, b'{"kind":"turn_completed","version":5,"turn_sequence":1,"at":2.5}'),
    ]), lambda seq, data: seen.append((seq, data["kind"], state.records)), state)
    assert done.state is state and done.refusal is None and done.seq == 2
    assert seen == [(1, "turn_started", 1), (2, "turn_completed", 2)]
