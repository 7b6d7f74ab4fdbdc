"""tests/spec_reader.py, the reader written from docs/FORMAT.md alone, against logs walj wrote:
it reads what walj.read reads, ends where walj's recovery would cut, and refuses damage."""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

import pytest
from faultfs import FaultyFS, abandon
from helpers import segments
from spec_reader import SpecError, read_log, read_records

import walj

ODD_RECORDS: list[dict[str, Any]] = [
    {},
    {"text": "caf\u00e9 \u4e2d \U0001f600 \"quoted\" \\ back\nslash"},
    {"big": 2**80, "neg": -1, "float": 1.5e-300, "t": True, "f": False, "n": None},
    {"deep": [[[[{"a": [1, {"b": []}]}]]]]},
    {"pad": "x" * 3000},
]


def test_spec_reader_imports_nothing_from_walj() -> None:
    tree = ast.parse((Path(__file__).parents[1] / "spec_reader.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not any(name.split(".")[0] == "walj" for name in imported), imported


@pytest.mark.parametrize("sync", ["always", "batch", "interval", "never"])
def test_reads_what_walj_wrote(tmp_path: Path, sync: str) -> None:
    rng = random.Random(sync)
    path = tmp_path / "log"
    expected: list[tuple[int, dict[str, Any]]] = []
    for life in range(3):  # reopens: a rotation when max_record_bytes grows, an empty segment
        with walj.Log.open(path, sync=sync, segment_bytes=1024,
                           max_record_bytes=8192 * (life + 1)) as log:
            for n in range(rng.randint(5, 40)):
                record = dict(ODD_RECORDS[n % len(ODD_RECORDS)], life=life, n=n)
                expected.append((log.append(record), record))
            batch = [{"batch": i} for i in range(4)]
            expected += zip(log.append_many(batch), batch, strict=True)
    assert len(segments(path)) > 3
    spec = read_log(path)
    assert spec.records == expected
    assert spec.records == [(r.seq, r.data) for r in walj.read(path)]
    assert spec.torn_tail is None
    assert spec.log_id == walj.verify(path).log_id


def test_ends_where_recovery_cuts_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with walj.Log.open(path, segment_bytes=1024) as log:
        for n in range(30):
            log.append({"n": n})
    last = segments(path)[-1]
    whole = last.read_bytes()
    for tail in (b'{"xxh64":"0123', b"\0" * 700 + b"\1",
                 whole.splitlines(keepends=True)[-1][:-1]):
        last.write_bytes(whole + tail)
        spec = read_log(path)
        assert spec.records == [(r.seq, r.data) for r in walj.read(path)]
        assert spec.torn_tail == (last.name, len(whole)), tail
        assert walj.verify(path).torn_tail.offset == len(whole)  # type: ignore[union-attr]
    last.write_bytes(whole)


def test_ends_where_recovery_cuts_a_crash_hole(tmp_path: Path) -> None:
    """A power cut that kept later unsynced appends and lost earlier ones leaves zeros and
    then verified lines: the reader ends at the hole, exactly where walj's recovery cuts."""
    holes = 0
    for trial in range(40):
        rng = random.Random(trial)
        path = tmp_path / f"log{trial}"
        fs = FaultyFS()
        log = walj.Log.open(path, sync="never", _fs=fs)
        log.append({"synced": True}, durable=True)
        for n in range(8):
            log.append({"n": n, "pad": "p" * rng.choice([10, 600, 1500])})
        fs.crash(rng.choice(["reorder", "tear"]), rng)
        abandon(log)
        spec = read_log(path)
        with walj.Log.open(path) as reopened:
            cut = reopened.torn_tail
            held = reopened.last_seq
        assert [seq for seq, _ in spec.records] == list(range(1, held + 1))
        if cut is None:
            assert spec.torn_tail is None
        else:
            assert spec.torn_tail == (cut.segment, cut.offset)
            holes += cut.kind == "zero_fill"
        assert read_records(path) == [(r.seq, r.data) for r in walj.read(path)]
    assert holes, "no trial left a hole: the test did not test it"


def _damaged(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    with walj.Log.open(path, segment_bytes=1024) as log:
        for n in range(60):
            log.append({"n": n, "pad": "d" * 40})
    assert len(segments(path)) >= 4
    return path


def _edit_line(segment: Path, index: int, old: bytes, new: bytes) -> None:
    lines = segment.read_bytes().splitlines(keepends=True)
    assert old in lines[index]
    lines[index] = lines[index].replace(old, new, 1)
    segment.write_bytes(b"".join(lines))


DAMAGE = {
    "flipped bit in a sealed segment": lambda p: _edit_line(segments(p)[1], 2, b'"d', b'"e'),
    "flipped bit, then a verified line": lambda p: _edit_line(segments(p)[-1], 1, b'"d', b'"e'),
    "missing middle segment": lambda p: segments(p)[1].unlink(),
    "segment from another log": lambda p: segments(p)[2].write_bytes(
        segments(_damaged(p.parent, p.name + "-other"))[2].read_bytes()),
    "duplicated line": lambda p: segments(p)[1].write_bytes(
        (lambda ls: b"".join(ls[:2] + ls[1:]))(segments(p)[1].read_bytes()
                                                .splitlines(keepends=True))),
    "unsealed segment before the last": lambda p: segments(p)[0].write_bytes(
        b"".join(segments(p)[0].read_bytes().splitlines(keepends=True)[:-1])),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_refuses_damage_walj_refuses(tmp_path: Path, damage: str) -> None:
    path = _damaged(tmp_path, "log")
    DAMAGE[damage](path)
    assert not walj.verify(path).ok
    with pytest.raises(SpecError):
        read_log(path)
