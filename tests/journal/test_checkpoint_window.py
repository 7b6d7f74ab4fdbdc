"""The replay window a checkpoint carries: kept as the checkpoint's columns and indexed on the
first lookup, it answers, evicts (oldest first, the carried calls before later ones) and feeds
the forgotten filter exactly as settling each call one by one; and the typed decoder of a
checkpoint record refuses (or accepts) every record exactly as the general decoder does."""

from __future__ import annotations

import base64
import json
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import walj
from walj._codec import MAX_DEPTH
from walj.errors import WaljError
from walj.journal import records as rc
from walj.journal._callindex import CallIndex, Forgotten
from walj.journal._checkpoint import SettledColumns, decode_checkpoint
from walj.journal.state import JournalState

IDS = [f"c{i}" for i in range(12)]


class OneByOne:
    """The window's meaning, written plainly: settle moves a call to the newest place, and
    the oldest falls out past the window."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.settled: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self.forgotten: list[str] = []

    def settle(self, call_id: str, sha: str, seq: int) -> None:
        self.settled.pop(call_id, None)
        self.settled[call_id] = (sha, seq)
        if len(self.settled) > self.window:
            self.forgotten.append(self.settled.popitem(last=False)[0])

    def unsettle(self, call_id: str) -> None:
        self.settled.pop(call_id, None)


chunks = st.lists(st.lists(st.sampled_from(IDS), max_size=6), max_size=4)
later = st.lists(st.tuples(st.sampled_from(["settle", "unsettle", "find"]),
                           st.sampled_from(IDS)), max_size=30)


@settings(max_examples=300, deadline=None)
@given(window=st.integers(0, 8), loaded=chunks, ops=later)
def test_a_window_loaded_as_columns_acts_as_settling_each_call(
        window: int, loaded: list[list[str]], ops: list[tuple[str, str]]) -> None:
    index, model = CallIndex(window), OneByOne(window)
    reference = CallIndex(window)  # the same calls settled one by one
    for seq, call_ids in enumerate(loaded, 1):
        shas = [f"{call_id}@{seq}" for call_id in call_ids]
        index.settle_many(call_ids, shas, seq)
        for call_id, sha in zip(call_ids, shas, strict=True):
            model.settle(call_id, sha, seq)
            reference.settle(call_id, sha, seq)
    for step, (op, call_id) in enumerate(ops, 100):
        for target in (index, model, reference):
            if op == "settle":
                target.settle(call_id, f"{call_id}@{step}", step)
            elif op == "unsettle":
                target.unsettle(call_id)
        if op == "find":
            assert index.find(call_id) == reference.find(call_id)
    assert list(index.settled.items()) == list(model.settled.items())
    assert index.filter_bytes() == reference.filter_bytes()
    for call_id in IDS:
        found = index.find(call_id)
        assert found == reference.find(call_id)
        if call_id in model.settled:
            assert found == model.settled[call_id]
        elif call_id in model.forgotten:
            assert isinstance(found, Forgotten)  # a filter has no false negatives


def _dispatch(journal: walj.ToolJournal, call_id: str, value: int) -> walj.ToolResult:
    with journal.turn() as turn:
        return turn.dispatch("ok", {"v": value}, call_id=call_id)


def ok(**arguments: Any) -> dict[str, Any]:
    return {"echo": arguments}


def _open(path: Path, window: int) -> walj.ToolJournal:
    return walj.ToolJournal.open(path, tools={"ok": ok}, store_outputs=True, sync="never",
                                 replay_window=window, checkpoint_every=None)


def test_calls_carried_by_a_checkpoint_fall_out_of_the_window_first(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with _open(path, 3) as journal:
        for number in range(3):
            _dispatch(journal, f"call-{number}", number)
        journal.checkpoint()
    with _open(path, 3) as journal:
        assert journal._core.state.from_checkpoint is not None  # the window came from it
        _dispatch(journal, "call-3", 3)  # the window is full: the oldest carried call goes
        oldest, kept, new = (_dispatch(journal, f"call-{n}", n) for n in (0, 1, 3))
    assert oldest.outcome == "refused" and rc.REFUSED_OUTSIDE_WINDOW in json.dumps(oldest.output)
    assert kept.replayed and kept.output == {"echo": {"v": 1}}
    assert new.replayed and new.output == {"echo": {"v": 3}}


# --- the typed decoder against the general one ---------------------------------------------------

def _checkpoint_record(tmp_path: Path) -> tuple[int, dict[str, Any]]:
    path = tmp_path / "s"
    with _open(path, 10) as journal:
        for number in range(4):
            _dispatch(journal, f"call-{number}", number)
        journal.checkpoint()
    (found,) = [(r.seq, r.data) for r in walj.read(path) if r.data["kind"] == rc.CHECKPOINT]
    return found


def _settled(data: dict[str, Any]) -> dict[str, Any]:
    return next(i for i in data["items"] if i["item"] == "settled_calls")


def _unpack(item: dict[str, Any]) -> dict[str, Any]:
    """A settled_calls item turned into the shape written before settlings were packed."""
    item["settlings"] = json.loads(zlib.decompress(base64.b64decode(item.pop("settlings_zlib"))))
    return item


def _unpacked(data: dict[str, Any]) -> dict[str, Any]:
    return _unpack(_settled(data))


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


CHANGES = {
    "as_written": lambda d: None,
    "seq_float": lambda d: _settled(d).update(settled_seqs=[1.0] * 4),
    "seq_zero": lambda d: _settled(d)["settled_seqs"].__setitem__(0, 0),
    "seq_negative": lambda d: _settled(d)["settled_seqs"].__setitem__(0, -3),
    "seq_bool": lambda d: _settled(d)["settled_seqs"].__setitem__(0, True),
    "seq_huge": lambda d: _settled(d)["settled_seqs"].__setitem__(0, 10**30),
    "id_empty": lambda d: _settled(d)["call_ids"].__setitem__(1, ""),
    "id_number": lambda d: _settled(d)["call_ids"].__setitem__(1, 7),
    "id_repeated": lambda d: _settled(d)["call_ids"].__setitem__(1, "call-0"),
    "sha_missing": lambda d: _settled(d).pop("arguments_sha256"),
    "sha_short": lambda d: _settled(d)["arguments_sha256"].pop(),
    "packed_empty": lambda d: _settled(d).update(settlings_zlib=""),
    "packed_number": lambda d: _settled(d).update(settlings_zlib=5),
    "packed_and_unpacked": lambda d: _settled(d).update(settlings=["{}"]),
    "unpacked": _unpacked,
    "unpacked_empty": lambda d: _unpacked(d)["settlings"].__setitem__(2, ""),
    "unpacked_short": lambda d: _unpacked(d)["settlings"].pop(),
    "unpacked_number": lambda d: _unpacked(d)["settlings"].__setitem__(1, 3),
    "neither": lambda d: _settled(d).pop("settlings_zlib"),
    "extra_field": lambda d: _settled(d).update(extra=1),
    "extra_field_deep": lambda d: _settled(d).update(extra=_deep(MAX_DEPTH - 3)),
    "extra_field_too_deep": lambda d: _settled(d).update(extra=_deep(MAX_DEPTH)),
    "top_field_too_deep": lambda d: d.update(extra=_deep(MAX_DEPTH)),
    "item_too_deep": lambda d: d["items"].append({"item": "cut", "x": _deep(MAX_DEPTH - 2)}),
    "items_not_list": lambda d: d.update(items={"item": "summary"}),
    "item_null": lambda d: d["items"].append(None),
    "version_unknown": lambda d: d.update(version=99),
}


def _outcome(feed: Any, seq: int) -> Any:
    state = JournalState(10)
    try:
        feed(state, seq)
    except WaljError as exc:
        return type(exc), str(exc)
    return state.snapshot(), list(state.calls.settled.items()), state.calls.filter_bytes()


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_the_typed_decoder_refuses_a_checkpoint_as_the_general_one(
        tmp_path: Path, name: str) -> None:
    seq, data = _checkpoint_record(tmp_path)
    CHANGES[name](data)
    raw = json.dumps(data, separators=(",", ":")).encode()
    assert raw.startswith(b'{"kind":"checkpoint",')  # in the written form: the typed path
    typed = _outcome(lambda state, s: state.feed(s, raw), seq)
    general = _outcome(lambda state, s: state._feed(s, rc.decode_object(s, raw)), seq)
    assert typed == general
    if name == "as_written":
        assert isinstance(typed[0], walj.Recovery) and len(typed[1]) == 4
        assert any(type(i) is SettledColumns for i in decode_checkpoint(raw)["items"])


@pytest.mark.parametrize("change", [b'"\xff"', b'"\\ud800"'])
def test_a_settling_text_that_is_not_utf8_is_refused_as_before(
        tmp_path: Path, change: bytes) -> None:
    seq, data = _checkpoint_record(tmp_path)
    _unpacked(data)["settlings"][0] = "MARK"
    raw = json.dumps(data, separators=(",", ":")).encode().replace(b'"MARK"', change)
    typed = _outcome(lambda state, s: state.feed(s, raw), seq)
    general = _outcome(lambda state, s: state._feed(s, rc.decode_object(s, raw)), seq)
    assert typed == general


# --- the settling records, packed, and the shape written before ---------------------------------

def _rewrite_checkpoint(path: Path, change: Any) -> int:
    """Apply `change` to every checkpoint part in the log, checksums redone; how many."""
    from walj.log import format as fmt

    rewritten = 0
    for segment in sorted(path.glob("seg-*.jsonl")):
        lines = segment.read_bytes().split(b"\n")
        for number, line in enumerate(lines):
            if b'"kind":"checkpoint"' not in line:
                continue
            framed = json.loads(line)
            change(framed["data"])
            body = json.dumps({"seq": framed["seq"], "data": framed["data"]},
                              separators=(",", ":"))
            lines[number] = fmt.frame(body[1:].encode())
            rewritten += 1
        segment.write_bytes(b"\n".join(lines))
    return rewritten


def _compacted(path: Path, runs: list[int]) -> dict[str, Any]:
    def counted(**arguments: Any) -> dict[str, Any]:
        runs.append(arguments["v"])
        return {"echo": arguments}

    options = {"tools": {"ok": counted}, "store_outputs": True, "sync": "never",
               "segment_bytes": 2048, "checkpoint_every": None}
    with walj.ToolJournal.open(path, **options) as journal:
        for number in range(5):
            _dispatch(journal, f"call-{number}", number)
        journal.compact()
    return options


def test_a_checkpoint_written_before_settlings_were_packed_still_opens_and_replays(
        tmp_path: Path) -> None:
    path, runs = tmp_path / "s", []
    options = _compacted(path, runs)

    def written_before(data: dict[str, Any]) -> None:
        data["version"] = 5  # the version before settlings were packed
        for item in data["items"]:
            if item["item"] == "settled_calls":
                _unpack(item)

    assert _rewrite_checkpoint(path, written_before) == 1
    assert b"settlings_zlib" not in b"".join(p.read_bytes() for p in path.glob("seg-*"))
    with walj.ToolJournal.open(path, **options) as journal:
        assert journal._core.log.first_seq > 1  # the settling records are only in the checkpoint
        replayed = _dispatch(journal, "call-2", 2)
        differs = _dispatch(journal, "call-3", 99)
    assert replayed.replayed and replayed.output == {"echo": {"v": 2}}
    assert differs.outcome == "refused" and not differs.replayed
    assert runs == [0, 1, 2, 3, 4]


def test_packed_settlings_that_cannot_be_read_refuse_the_replay_and_run_nothing(
        tmp_path: Path) -> None:
    path, runs = tmp_path / "s", []
    options = _compacted(path, runs)
    garbage = base64.b64encode(zlib.compress(b'["not", "five"]')).decode()
    assert _rewrite_checkpoint(path, lambda data: [
        item.update(settlings_zlib=garbage) for item in data["items"]
        if item["item"] == "settled_calls"]) == 1
    with walj.ToolJournal.open(path, **options) as journal:  # read when a call is replayed
        with pytest.raises(walj.CorruptionError, match="settlings"), journal.turn() as turn:
            turn.dispatch("ok", {"v": 2}, call_id="call-2")
        fresh = _dispatch(journal, "new-call", 7)
    assert fresh.outcome == "ok" and runs == [0, 1, 2, 3, 4, 7]
