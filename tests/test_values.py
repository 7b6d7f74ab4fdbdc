"""What a value may hold, one regression test per issue item: data is never silently changed
(8), the nesting limit holds (9), reserved actors cannot be spoofed (13), deep model
arguments are one call's error (20), a reconcile answer that is a str subclass (22), and
describing an output never raises."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import enum
import json
import math
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from helpers import fingerprint
from hypothesis import given, settings
from hypothesis import strategies as st
from journal_helpers import Recorder, records

import walj
from walj import _codec, _deepjson
from walj._codec import NestingError
from walj.errors import SerializationError
from walj.journal import records as rc
from walj.journal._fingerprint import Redactor, canonical_json, describe_output
from walj.journal._resolve import check_actor


def nested(depth: int, leaf: Any = 1) -> Any:
    """`depth` lists, one inside the other, around `leaf`."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def at_depth(frames: int, call: Callable[[], Any]) -> Any:
    """`call()` from `frames` Python frames further down the stack."""
    if frames:
        return at_depth(frames - 1, call)
    return call()


def appended(path: Path, record: Any) -> list[dict[str, Any]]:
    """Append `record` to a fresh log and return what reading the log gives back."""
    with walj.Log.open(path, sync="never") as log:
        log.append(record)
    return [r.data for r in walj.read(path)]


def refusal(path: Path, record: Any) -> str:
    """The SerializationError message for appending `record`; asserts nothing was written."""
    with walj.Log.open(path, sync="never") as log:
        with pytest.raises(SerializationError) as info:
            log.append(record)
        with pytest.raises(SerializationError):
            log.append_many([{"ok": 1}, record])
        assert log.last_seq == 0
        assert log.append({"ok": 2}) == 1
    assert [r.data for r in walj.read(path)] == [{"ok": 2}]
    return str(info.value)


# --- item 8: what is read back equals what was appended ---------------------------------------


def test_item8_int_and_str_key_collision_is_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path / "log", {1: 100, "1": 250})
    assert message.startswith("record has the key 1 of type int: JSON object keys are strings")


@pytest.mark.parametrize("key", [1, 1.5, True, None, (1, 2), b"k", uuid.UUID(int=7)],
                         ids=repr)
def test_item8_keys_that_are_not_strings_are_refused_with_their_path(
        tmp_path: Path, key: Any) -> None:
    message = refusal(tmp_path / "log", {"a": [0, {key: "x"}]})
    assert message.startswith(f'record["a"][1] has the key {key!r} of type ')


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int


@pytest.mark.parametrize("value, kind", [
    (b"hi", "bytes"), (bytearray(b"hi"), "bytearray"), (memoryview(b"hi"), "memoryview"),
    ({1, 2}, "set"), (frozenset([1]), "frozenset"),
    (datetime.datetime(2026, 1, 2, 3, 4), "datetime.datetime"),
    (datetime.date(2026, 1, 2), "datetime.date"), (datetime.timedelta(1), "datetime.timedelta"),
    (uuid.UUID(int=1), "uuid.UUID"), (decimal.Decimal("1.5"), "decimal.Decimal"),
    (Colour.RED, f"{__name__}.Colour"), (Point(1), f"{__name__}.Point"), (object(), "object"),
    (1j, "complex"), (range(3), "range"),
], ids=lambda v: type(v).__name__)
def test_item8_values_json_would_change_are_refused_with_their_path(
        tmp_path: Path, value: Any, kind: str) -> None:
    message = refusal(tmp_path / "log", {"a": [0, 1, 2, value]})
    assert message.startswith(f'record["a"][3] is of type {kind}: ')


@pytest.mark.parametrize("value, reason", [
    (float("nan"), "is nan, which JSON cannot represent"),
    (float("inf"), "is inf, which JSON cannot represent"),
    (-float("inf"), "is -inf, which JSON cannot represent"),
    (10**4300, "is an integer of more than 4300 digits"),
    ("ok \ud800", "holds a lone surrogate"),
], ids=["nan", "inf", "-inf", "long int", "surrogate"])
def test_item8_numbers_and_text_json_cannot_hold_are_refused_with_their_path(
        tmp_path: Path, value: Any, reason: str) -> None:
    message = refusal(tmp_path / "log", {"a": {"b": [value]}})
    assert message.startswith(f'record["a"]["b"][0] {reason}')


def test_item8_a_key_with_a_lone_surrogate_is_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path / "log", {"a": {"\udc00": 1}})
    assert message.startswith('record["a"] has a key that holds a lone surrogate')


def test_item8_json_values_read_back_exactly_as_appended(tmp_path: Path) -> None:
    record = {"s": "é\u2603\n", "i": -(2**70), "big": 10**4299, "f": [0.1, -0.0, 1e300, 5e-324],
              "b": [True, False], "n": None, "d": {"": {}, "l": []}, "t": (1, (2, "x"))}
    [back] = appended(tmp_path / "log", record)
    assert back == {**record, "t": [1, [2, "x"]]}  # tuple -> list, the one conversion
    assert type(back["i"]) is int and type(back["f"][0]) is float
    assert math.copysign(1.0, back["f"][1]) == -1.0


class Level(enum.IntEnum):
    HIGH = 3


class Mood(str, enum.Enum):
    CALM = "calm"


class Name(str):
    pass


class Count(int):
    pass


class Ratio(float):
    pass


class Items(list[Any]):
    pass


class Pair(tuple[Any, ...]):
    pass


def test_item8_subclasses_are_stored_as_the_plain_values_they_hold(tmp_path: Path) -> None:
    """The journal accepts str and int subclasses (an IntEnum, a str subclass); the log stores
    them too, as their plain value, so the two agree and the read value is of the plain type."""
    record = {"level": Level.HIGH, "mood": Mood.CALM, "name": Name("ann"), "n": Count(7),
              "r": Ratio(0.5), "o": collections.OrderedDict(b=1, a=2),
              "dd": collections.defaultdict(list, x=[1]), "l": Items([1, Name("x")]),
              "p": Pair((1, 2)), Name("key"): "v"}
    plain = {"level": 3, "mood": "calm", "name": "ann", "n": 7, "r": 0.5, "o": {"b": 1, "a": 2},
             "dd": {"x": [1]}, "l": [1, "x"], "p": [1, 2], "key": "v"}
    [back] = appended(tmp_path / "log", record)
    assert back == plain
    assert [type(v) for v in back.values()] == [type(v) for v in plain.values()]
    assert all(type(k) is str for k in back)
    assert fingerprint(record) == fingerprint(plain)


class SameText(str):
    """Equal to nothing but itself: two of them with the same text are two keys."""

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


def test_item8_two_keys_with_the_same_text_are_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path / "log", {"a": {SameText("k"): 1, SameText("k"): 2}})
    assert message == 'record["a"] has two keys that are the same text'


class Overriding(dict[str, Any]):
    """A dict subclass whose methods lie about what it holds."""

    def items(self) -> Any:
        return [("forged", True)]

    def __iter__(self) -> Iterator[str]:
        return iter(["forged"])

    def values(self) -> Any:
        return [True]


def test_item8_a_subclass_is_stored_from_its_own_storage(tmp_path: Path) -> None:
    value = Overriding(real=1)
    [back] = appended(tmp_path / "log", {"v": value})
    assert back == {"v": {"real": 1}}
    assert fingerprint(value) == fingerprint({"real": 1})


json_scalars = (st.none() | st.booleans() | st.integers() | st.text()
                | st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(
    json_scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=25,
)
odd_scalars = st.sampled_from([
    b"b", {1}, frozenset(), float("nan"), float("inf"), Level.HIGH, Mood.CALM,
    Name("n"), Count(2), Ratio(1.5), Colour.RED, Point(1), datetime.date(2026, 1, 1),
    decimal.Decimal(1), uuid.UUID(int=3), object(), 2**64, -(2**63) - 1,
]) | st.builds(lambda: 10**4400)  # built, not listed: its repr would exceed the digit limit
any_values = st.recursive(
    json_scalars | odd_scalars,
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(st.text(max_size=3) | st.integers(0, 3)
                                     | st.just(Name("k")), inner, max_size=4)
                   | st.builds(Items, st.lists(inner, max_size=3))),
    max_leaves=20,
)


def _plain_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {str.__str__(k): _plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_json(v) for v in value]
    return value


@given(json_values)
@settings(max_examples=300, deadline=None)
def test_item8_every_json_value_reads_back_equal(value: Any) -> None:
    assert _codec.decode(_codec.encode({"v": value})) == {"v": _plain_json(value)}


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except SerializationError:
        return "refused"


@given(any_values)
@settings(max_examples=400, deadline=None)
def test_item8_the_log_and_the_journal_accept_the_same_values(value: Any) -> None:
    """One set of rules: what the log refuses the fingerprint refuses, and the fast check on the
    append path decides exactly as the careful walk that names the path."""
    log = _outcome(lambda: _codec.encode({"v": value}))
    journal = _outcome(lambda: canonical_json({"v": value}))
    assert (log == "refused") == (journal == "refused")

    def fast() -> Any:
        try:
            return _codec._scan([value], 1, _codec.MAX_DEPTH)
        except _codec._Refused:
            return "refused"

    assert fast() == _outcome(lambda: _codec._walk([value], _codec.MAX_DEPTH, "v"))
    if log != "refused":
        assert _codec.decode(log) == {"v": _codec._plain(value)}


# --- item 9: the nesting limit --------------------------------------------------------------


def test_item9_256_deep_record_is_accepted_and_reads_back_from_any_stack(tmp_path: Path) -> None:
    """256 containers, the record's own dict included, is legal: it reads back whatever the
    reader's own call stack, including 850 Python frames down."""
    path = tmp_path / "log"
    record = {"deep": nested(255)}
    with walj.Log.open(path, sync="never") as log:
        assert log.append(record) == 1
        assert log.append({"after": True}) == 2
    for frames in (0, 200, 850):
        back = at_depth(frames, lambda: [r.data for r in walj.read(path)])
        assert back == [record, {"after": True}], frames
    assert walj.verify(path).ok
    assert at_depth(850, lambda: _codec.decode(_codec.encode(record))) == record


def test_item9_257_deep_record_is_refused(tmp_path: Path) -> None:
    with walj.Log.open(tmp_path / "log", sync="never") as log:
        with pytest.raises(NestingError) as info:
            log.append({"deep": nested(256)})
        assert log.last_seq == 0
    assert str(info.value).startswith('record["deep"][0][0][0][0][0]…244 more…[0]')
    assert str(info.value).endswith("is nested more than 256 containers deep (or holds itself)")


@pytest.mark.parametrize("wrap", [
    lambda v: [v], lambda v: (v,), lambda v: {"k": v}, lambda v: Items([v]),
    lambda v: collections.OrderedDict(k=v),
], ids=["list", "tuple", "dict", "list subclass", "dict subclass"])
def test_item9_depth_counts_every_stored_container(tmp_path: Path, wrap: Any) -> None:
    value: Any = 1
    for _ in range(255):
        value = wrap(value)
    assert appended(tmp_path / "ok", {"d": value})[0]["d"] == _plain_json(value)
    with walj.Log.open(tmp_path / "deep", sync="never") as log:
        with pytest.raises(NestingError):
            log.append({"d": wrap(value)})


@pytest.mark.parametrize("depth", [300, 600, 980])
@pytest.mark.parametrize("wrap", [
    lambda v: frozenset([v]), lambda v: (frozenset([v]),), lambda v: (v,),
], ids=["frozenset", "frozenset in a tuple", "tuple"])
def test_item9_deep_records_are_refused_not_acknowledged(tmp_path: Path, wrap: Any,
                                                         depth: int) -> None:
    """Frozensets used to escape the depth count: a record hundreds of levels deep was
    acknowledged and then could not be read back."""
    value: Any = 1
    for _ in range(depth):
        value = wrap(value)
    with walj.Log.open(tmp_path / "log", sync="never") as log:
        with pytest.raises(SerializationError):
            log.append({"deep": value})
        assert log.last_seq == 0


def test_item9_a_record_that_holds_itself_is_refused(tmp_path: Path) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with walj.Log.open(tmp_path / "log", sync="never") as log:
        with pytest.raises(NestingError):
            log.append({"loop": loop})


def test_item9_appending_and_fingerprinting_from_a_deep_stack(tmp_path: Path) -> None:
    path = tmp_path / "log"
    deep = {"deep": nested(255, "leaf")}
    with walj.Log.open(path, sync="never") as log:
        assert at_depth(850, lambda: log.append(deep)) == 1
    assert [r.data for r in walj.read(path)] == [deep]
    arguments = {"a": nested(199, 1.5)}
    assert at_depth(850, lambda: fingerprint(arguments)) == fingerprint(arguments)


STDLIB_ONLY = """
import sys
sys.modules["msgspec"] = None  # as in the forensic zipapp: the standard library alone
from walj import _codec
from walj.errors import SerializationError
assert not _codec.HAVE_MSGSPEC
value = 1
for _ in range(255):
    value = [value]
record = {"deep": value}
data = _codec.encode(record)
def at_depth(frames):
    return at_depth(frames - 1) if frames else _codec.decode(data)
assert at_depth(850) == record
for bad in ({"a": [{1, 2}]}, {"a": [value]}):
    try:
        _codec.encode(bad)
    except SerializationError as exc:
        print(exc)
"""


def test_item9_with_the_standard_library_alone(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", STDLIB_ONLY], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        'record["a"][0] is of type set: JSON has no sets (it would be read back as a list); '
        "store dict, list, str, int, float, bool or None",
        'record["a"][0][0][0][0][0]…244 more…[0][0][0][0][0][0] is nested more than 256 '
        "containers deep (or holds itself)",
    ]


@given(json_values)
@settings(max_examples=300, deadline=None)
def test_item9_the_stack_free_codec_agrees_with_json(value: Any) -> None:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert _deepjson.loads(text.encode()) == json.loads(text)
    assert _deepjson.loads(json.dumps(value, indent=1)) == json.loads(text)
    plain = _plain_json(value)
    for sort_keys in (False, True):
        assert _deepjson.dumps(plain, sort_keys) == json.dumps(
            plain, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)


@pytest.mark.parametrize("text", [
    "", " ", "[", "]", "[1,]", "[1 2]", '{"a"}', '{"a":}', '{"a":1,}', "{1:2}", "nul", "tru",
    "NaN", "[Infinity]", "-Infinity", "01", "1.", "-", "1e400", '"\x01"', '"a', "[1]]", "{}{}",
    "\ufeff[]", "[1]x",
])
def test_item9_the_stack_free_parser_refuses_what_is_not_one_json_value(text: str) -> None:
    with pytest.raises(ValueError):
        _deepjson.loads(text.encode("utf-8"))


def test_item9_the_stack_free_parser_reads_any_depth() -> None:
    depth = 100_000
    value = _deepjson.loads(b"[" * depth + b"]" * depth)
    for _ in range(depth - 1):
        value = value[0]
    assert value == []


# --- item 13: reserved actors cannot be spoofed ---------------------------------------------


def _interrupt(path: Path) -> str:
    """Leave one ambiguous execution of tool `send` in the journal at `path`; its id."""
    seen: list[walj.ToolContext] = []

    def handler(context: walj.ToolContext, **_: Any) -> None:
        seen.append(context)
        raise KeyboardInterrupt

    with walj.ToolJournal.open(path, tools={"send": handler}) as journal:
        with pytest.raises(KeyboardInterrupt), journal.turn() as turn:
            turn.dispatch("send", {"to": "ann"}, call_id="c1")
    return seen[0].execution_id


LOOK_ALIKES = [
    "policy ", " policy", "Policy", "POLICY", "ｐｏｌｉｃｙ", "policy\u200b",
    "\u200bpolicy", "pol\u00adicy", "policy\u00a0", "policy\u2060", "\ufeffpolicy",
    "policy\u202e", "po licy", "policy\u3000",
    "reconcile\u200b:send_email", "Reconcile:send_email", "RECONCILE:x", "reconcile:",
    "reconcile\uff1asend_email", "reconcile :send_email", " reconcile:send_email",
    "\u211beconcile:x", "re\u200dconcile:send", "reconcile\ufe55send",
]


@pytest.mark.parametrize("actor", LOOK_ALIKES, ids=ascii)
def test_item13_look_alikes_of_reserved_actors_are_refused(tmp_path: Path, actor: str) -> None:
    path = tmp_path / "j"
    execution_id = _interrupt(path)
    with walj.ToolJournal.open(path) as journal:
        before = journal._log.last_seq
        with pytest.raises(walj.ResolutionError) as info:
            journal.resolve(execution_id, "succeeded", actor=actor)
        assert info.value.reason == "bad_actor"
        assert "reserved for automatic settlements" in str(info.value)
        assert journal._log.last_seq == before
        assert journal.recovery.blocked


@pytest.mark.parametrize("actor", [
    "ann\n", "ann\r", "policy\t", "ann\x00", "\x1b[2Kpolicy", "ann\x7f", "ann\x85",
    "ann\u2028", "ann\u2029", "ann\ud800", "", " ", "\u200b", "\u200b \u2060",
], ids=ascii)
def test_item13_control_characters_and_empty_actors_are_refused(actor: str) -> None:
    with pytest.raises(walj.ResolutionError) as info:
        check_actor(actor)
    assert info.value.reason == "bad_actor"


@pytest.mark.parametrize("actor", [
    "ann", "Ann Smith", "policy-bot", "policyholder", "reconciler", "ops:reconcile:x", "Zoë",
    "李雷", "ann@example.com", "Name('x')",
])
def test_item13_people_are_still_accepted_and_recorded_as_given(tmp_path: Path,
                                                                actor: str) -> None:
    path = tmp_path / "j"
    execution_id = _interrupt(path)
    with walj.ToolJournal.open(path) as journal:
        resolution = journal.resolve(execution_id, "succeeded", actor=actor)
        assert resolution.actor == actor
        assert not journal.recovery.blocked
    assert records(path)[-1]["actor"] == actor


# --- item 20: deep model arguments are that one call's error --------------------------------

DEEP_TEXT = "[" * 100_000


def _calls() -> list[Any]:
    return [
        {"name": "echo", "arguments": {"n": 1}, "call_id": "c1"},
        {"id": "c2", "type": "function", "function": {"name": "echo", "arguments": DEEP_TEXT}},
        {"id": "c3", "type": "function", "function": {"name": "echo", "arguments": '{"n":3}'}},
    ]


def test_item20_deeply_nested_arguments_are_one_calls_error_without_a_journal() -> None:
    echo = Recorder("done")
    results = walj.handle_function_calls(_calls(), {"echo": echo})
    assert [(r["call_id"], r["output"], r["error"]) for r in results] == [
        ("c1", "done", None),
        ("c2", None, "arguments are nested too deeply to parse"),
        ("c3", "done", None),
    ]
    assert echo.calls == [{"n": 1}, {"n": 3}]


def test_item20_deeply_nested_arguments_are_one_calls_error_with_a_journal(
        tmp_path: Path) -> None:
    echo = Recorder("done")
    calls = [*_calls(), {"name": "echo", "arguments": {"n": nested(200)}, "call_id": "c4"},
             {"name": "echo", "arguments": {"n": nested(199)}, "call_id": "c5"}]
    with walj.ToolJournal.open(tmp_path / "j", tools={"echo": echo}) as journal:
        results = journal.handle_function_calls(calls)
        assert not journal.recovery.blocked
    assert [(r["call_id"], r["output"]) for r in results] == [
        ("c1", "done"), ("c2", None), ("c3", "done"), ("c4", None), ("c5", "done")]
    assert results[1]["error"] == "arguments are nested too deeply to parse"
    assert results[3]["error"].startswith('arguments["n"][0][0][0][0][0]…')
    assert results[3]["error"].endswith("is nested more than 200 containers deep (or holds "
                                        "itself)")
    assert [r["error"] for r in results[::2]] == [None, None, None]
    assert echo.calls == [{"n": 1}, {"n": 3}, {"n": nested(199)}]
    started = [r["call_id"] for r in records(tmp_path / "j") if r["kind"] == rc.STARTED]
    assert started == ["c1", "c3", "c5"]


def test_item20_nan_and_unstorable_json_text_are_one_calls_error(tmp_path: Path) -> None:
    calls = [
        {"name": "echo", "arguments": '{"x": NaN}', "call_id": "nan"},
        {"name": "echo", "arguments": '{"x": "\\ud800"}', "call_id": "surrogate"},
        {"name": "echo", "arguments": '{"x": 1}', "call_id": "ok"},
    ]
    plain = walj.handle_function_calls(calls, {"echo": Recorder("done")})
    assert plain[0]["error"] == "arguments are not valid JSON: NaN is not JSON"
    assert [r["output"] for r in plain] == [None, "done", "done"]  # no journal: no storing
    echo = Recorder("done")
    with walj.ToolJournal.open(tmp_path / "j", tools={"echo": echo}) as journal:
        journaled = journal.handle_function_calls(calls)
    assert journaled[0] == plain[0]
    assert journaled[1]["error"] == 'arguments["x"] holds a lone surrogate, which is not UTF-8'
    assert journaled[2]["output"] == "done" and echo.calls == [{"x": 1}]


# --- item 22: a reconcile answer that is a str subclass -------------------------------------


class Verdict(str, enum.Enum):
    SUCCEEDED = "succeeded"


class Agreeable(str):
    """Text "banana" that claims to equal anything."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


@pytest.mark.parametrize("answer", [Verdict.SUCCEEDED, Name("succeeded")], ids=repr)
def test_item22_a_str_subclass_answer_is_recorded_as_the_plain_str(tmp_path: Path,
                                                                   answer: str) -> None:
    path = tmp_path / "j"
    execution_id = _interrupt(path)
    tools = {"send": walj.Tool(Recorder(), reconcile=lambda b: answer)}
    with walj.ToolJournal.open(path, tools=tools) as journal:
        assert not journal.recovery.blocked
        [resolution] = journal.recovery.resolved
        assert (resolution.execution_id, resolution.actor) == (execution_id, "reconcile:send")
        assert type(resolution.outcome) is str and resolution.outcome == "succeeded"
    last = records(path)[-1]
    assert (last["kind"], last["outcome"]) == (rc.RESOLVED, "succeeded")
    assert last["note"] == "the reconcile hook of 'send' answered 'succeeded'"


def test_item22_an_answer_that_only_compares_equal_is_a_failed_reconcile(tmp_path: Path) -> None:
    path = tmp_path / "j"
    execution_id = _interrupt(path)
    asked: list[str] = []

    def reconcile(blocker: walj.Blocker) -> str:
        asked.append(blocker.execution_id or "")
        return Agreeable("banana")

    tools = {"send": walj.Tool(Recorder(), reconcile=reconcile, on_ambiguous="assume_done")}
    for _ in range(2):  # the execution stays ambiguous, and the hook is asked again
        with walj.ToolJournal.open(path, tools=tools) as journal:
            assert journal.recovery.blocked
            assert journal.recovery.resolved == ()
    assert asked == [execution_id, execution_id]
    failed = [r for r in records(path) if r["kind"] == rc.RECONCILE_FAILED]
    assert [r["error"] for r in failed] == [
        "ValueError: reconcile returned 'banana'; expected 'succeeded', 'not_performed' or "
        "None"] * 2


# --- describe_output never raises -----------------------------------------------------------


class BrokenItems(dict[str, Any]):
    def items(self) -> Any:
        raise RuntimeError("items is broken")


class BrokenIteration(dict[str, Any]):
    def items(self) -> Any:
        yield "a", 1
        raise RuntimeError("iteration is broken")


class BrokenMapping(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("getitem is broken")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("iteration is broken")

    def __len__(self) -> int:
        raise RuntimeError("len is broken")

    def __repr__(self) -> str:
        raise RuntimeError("repr is broken")


class BrokenEverything(dict[str, Any]):
    def items(self) -> Any:
        raise RuntimeError("items is broken")

    def __iter__(self) -> Any:
        raise RuntimeError("iteration is broken")

    def __len__(self) -> int:
        raise RuntimeError("len is broken")

    def __repr__(self) -> str:
        raise RuntimeError("repr is broken")


def test_plus_describe_output_never_raises_for_outputs_whose_methods_raise() -> None:
    redactor = Redactor()
    items = describe_output(BrokenItems(a=1, token="t"), 100, redactor)
    assert items == (fingerprint({"a": 1, "token": "t"}), '{"a":1,"token":"[redacted]"}', 28)
    iteration = describe_output(BrokenIteration(a=2), 100, redactor)
    assert iteration == (fingerprint({"a": 2}), '{"a":2}', 7)
    mapping = describe_output(BrokenMapping(), 100, redactor)
    assert mapping == (None, "<unrepresentable BrokenMapping>", 31)
    unstorable = BrokenEverything(s={1})
    assert describe_output(unstorable, 100, redactor) == (
        None, "<unrepresentable BrokenEverything>", 34)


@pytest.mark.parametrize("output, sha, preview", [
    (BrokenItems(a=1), fingerprint({"a": 1}), '{"a":1}'),
    (BrokenEverything(s={1}), None, "<unrepresentable BrokenEverything>"),
], ids=["broken items", "broken everything"])
def test_plus_a_tool_returning_an_output_whose_methods_raise_is_recorded(
        tmp_path: Path, output: Any, sha: str | None, preview: str) -> None:
    path = tmp_path / "j"
    with walj.ToolJournal.open(path, tools={"t": Recorder(output)}) as journal:
        with journal.turn() as turn:
            result = turn.dispatch("t", {})
        assert (result.outcome, result.output) == ("ok", output)
        assert not journal.recovery.blocked
    finished = records(path)[-2]
    assert (finished["kind"], finished["outcome"], finished["output_sha256"],
            finished["output_preview"]) == (rc.FINISHED, "ok", sha, preview)
