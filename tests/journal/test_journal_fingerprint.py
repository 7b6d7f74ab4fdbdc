"""Fingerprints, previews and redaction of tool arguments and outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import fingerprint
from hypothesis import given, settings
from hypothesis import strategies as st

from walj.errors import SerializationError
from walj.journal._fingerprint import (
    TRUNCATION_MARKER,
    Redactor,
    canonical_json,
    describe_arguments,
    describe_output,
    idempotency_key,
    preview,
    safe_cut,
)

ROOT = Path(__file__).resolve().parents[2]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def test_canonical_json_sorts_keys_compactly_without_ascii_escapes() -> None:
    assert canonical_json({"b": 1, "a": [1, 2.5, None, True], "é": "ü"}) == (
        '{"a":[1,2.5,null,true],"b":1,"é":"ü"}'
    )


def test_fingerprint_ignores_key_order_and_matches_sha256_of_the_text() -> None:
    import hashlib

    a = {"x": {"q": 1, "p": 2}, "y": "z"}
    b = {"y": "z", "x": {"p": 2, "q": 1}}
    assert fingerprint(a) == fingerprint(b)
    expected = hashlib.sha256(b'{"x":{"p":2,"q":1},"y":"z"}').hexdigest()
    assert fingerprint(a) == expected
    assert fingerprint({"x": 1}) != fingerprint({"x": "1"})
    assert fingerprint({"x": 1}) != fingerprint({"x": True})


@pytest.mark.parametrize(
    "value",
    [
        {"x": float("nan")},
        {"x": float("inf")},
        {1: "int key"},
        {"x": {1, 2}},
        {"x": b"bytes"},
        {"x": object()},
        {"x": "\ud800"},
        {"x": 10**5000},
    ],
)
def test_values_json_cannot_represent_are_refused(value: object) -> None:
    with pytest.raises(SerializationError):
        fingerprint(value)


def test_deep_nesting_is_refused_not_a_recursion_error() -> None:
    value: object = "leaf"
    for _ in range(1000):
        value = [value]
    with pytest.raises(SerializationError):
        fingerprint(value)


def test_tuples_are_arrays() -> None:
    assert fingerprint({"x": (1, 2)}) == fingerprint({"x": [1, 2]})


def test_fingerprint_is_the_same_in_another_process_with_another_hash_seed() -> None:
    value = {"to": "ä@example.com", "n": [1, 2.5, -0.0, 1e300], "nested": {"b": None, "a": True}}
    code = (
        "import json,sys; from walj.journal._fingerprint import canonical_json, sha256_text; "
        "print(sha256_text(canonical_json(json.loads(sys.stdin.read()))))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(value), env=env,
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == fingerprint(value)


@given(json_values)
@settings(max_examples=150, deadline=None)
def test_fingerprint_survives_a_json_round_trip(value: object) -> None:
    assert fingerprint(json.loads(json.dumps(value))) == fingerprint(value)


def test_preview_collapses_whitespace_and_keeps_short_text() -> None:
    assert preview("  a \n\t b   c  ", 800) == "a b c"


def test_cut_preview_ends_with_marker_and_respects_the_limit() -> None:
    text = "word " * 1000
    out = preview(text, 100)
    assert len(out) <= 100
    assert out.endswith(TRUNCATION_MARKER)
    assert out.startswith("word word")


def test_cut_never_splits_combining_sequences_or_flags() -> None:
    text = "e\u0301" * 50  # e + combining acute
    for limit in range(13, 60):
        out = preview(text, limit)
        body = out[: -len(TRUNCATION_MARKER)]
        assert not body or body[-1] == "\u0301"
    flags = "\U0001f1eb\U0001f1f7" * 40  # French flags: pairs of regional indicators
    for limit in range(13, 60):
        body = preview(flags, limit)[: -len(TRUNCATION_MARKER)]
        assert len(body) % 2 == 0
    zwj = "\U0001f468\u200d\U0001f469\u200d\U0001f467" * 20
    assert safe_cut(zwj, 2) == 0


@given(st.text(), st.integers(min_value=1, max_value=300))
@settings(max_examples=200, deadline=None)
def test_preview_is_bounded_and_marked_when_cut(text: str, limit: int) -> None:
    out = preview(text, limit)
    assert len(out) <= limit
    collapsed = " ".join(text.split())
    if len(collapsed) <= limit:
        assert out == collapsed
    else:
        assert out.endswith(TRUNCATION_MARKER[: limit])


def test_redaction_masks_previews_but_not_the_fingerprint() -> None:
    redactor = Redactor()
    args = {"user": "ann", "Password": "hunter2", "auth": {"X-Api-Key": "k", "max_tokens": 5},
            "list": [{"github_token": "t"}], "apiKey": "camel", "cookies": "plural"}
    digest = describe_arguments(args, 800, redactor)
    assert "hunter2" not in digest.preview
    assert '"X-Api-Key":"[redacted]"' in digest.preview
    assert '"github_token":"[redacted]"' in digest.preview
    assert '"apiKey":"[redacted]"' in digest.preview
    assert '"max_tokens":5' in digest.preview
    assert digest.sha256 == fingerprint(args)
    assert args["Password"] == "hunter2"  # the caller's value is untouched


def test_redact_keys_are_configurable() -> None:
    digest = describe_arguments({"ssn": "123", "password": "p"}, 800, Redactor(["ssn"]))
    assert "123" not in digest.preview and '"password":"p"' in digest.preview
    assert describe_arguments({"password": "p"}, 800, Redactor([])).preview == '{"password":"p"}'
    with pytest.raises(TypeError):
        Redactor("password")


def test_huge_arguments_give_a_bounded_preview_and_the_source_length() -> None:
    args = {"blob": "x" * 3_000_000}
    digest = describe_arguments(args, 800, Redactor())
    assert len(digest.preview) <= 800
    assert digest.preview.endswith(TRUNCATION_MARKER)
    assert digest.length == len(canonical_json(args))


def test_output_description_never_raises() -> None:
    class Odd:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert describe_output(Odd(), 1200, Redactor()).sha256 is None
    assert describe_output({1, 2}, 1200, Redactor()).preview == "{1, 2}"
    text = describe_output("plain   text", 1200, Redactor())
    assert text.preview == "plain text" and text.sha256 == fingerprint("plain   text")


plain_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(plain_values | json_values)
@settings(max_examples=300, deadline=None)
def test_the_fast_encoder_never_changes_a_fingerprint(value: object) -> None:
    """The journal passes msgspec's sorted encoder for speed; where it is used, its output must
    be byte-identical to the standard library's canonical JSON."""
    from walj.journal._fingerprint import FAST_CANONICAL

    assert FAST_CANONICAL is not None
    digest = describe_arguments(value, 800, Redactor(), FAST_CANONICAL)
    assert digest.sha256 == fingerprint(value)
    assert digest.preview == describe_arguments(value, 800, Redactor()).preview


def test_the_fast_encoder_leaves_odd_values_to_the_reference_path() -> None:
    import enum
    from collections import OrderedDict

    from walj.journal._fingerprint import FAST_CANONICAL

    class Level(enum.IntEnum):
        HIGH = 3

    class Name(str):
        pass

    for value in ({"n": Level.HIGH}, {"s": Name("x")}, OrderedDict(b=1, a=2), {"big": 2**70},
                  {"f": 1e22}, {"t": (1, "a")}):
        digest = describe_arguments(value, 800, Redactor(), FAST_CANONICAL)
        assert digest.sha256 == fingerprint(value), value
    with pytest.raises(SerializationError):
        describe_arguments({"x": "\ud800"}, 800, Redactor(), FAST_CANONICAL)


@given(st.text(), st.text(), st.text())
@settings(max_examples=100, deadline=None)
def test_idempotency_key_is_canonical_json_of_its_parts(
    call_id: str, tool: str, log_id: str
) -> None:
    import hashlib

    try:
        expected = hashlib.sha256(
            canonical_json([log_id, call_id, tool, "f" * 64]).encode()).hexdigest()[:32]
    except SerializationError:
        with pytest.raises(SerializationError):
            idempotency_key(log_id, call_id, tool, "f" * 64)
        return
    assert idempotency_key(log_id, call_id, tool, "f" * 64) == expected


def test_idempotency_key_is_deterministic_and_input_sensitive() -> None:
    key = idempotency_key("a" * 32, "call-1", "send", "f" * 64)
    assert key == idempotency_key("a" * 32, "call-1", "send", "f" * 64)
    assert len(key) == 32
    assert key != idempotency_key("b" * 32, "call-1", "send", "f" * 64)
    assert key != idempotency_key("a" * 32, "call-1x", "send", "f" * 64)
    assert key != idempotency_key("a" * 32, "call-1", "sendx", "f" * 64)
    assert key != idempotency_key("a" * 32, "call-1", "send", "e" * 64)
