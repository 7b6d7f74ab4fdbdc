"""Fingerprints and previews of tool arguments and outputs: canonical-JSON SHA-256, bounded
whitespace-collapsed previews, and key redaction. Standard library only (the forensic tool)."""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any, NamedTuple

from .errors import SerializationError

ARGUMENTS_PREVIEW_CHARS = 800
OUTPUT_PREVIEW_CHARS = 1200
DEFAULT_REDACT_KEYS: tuple[str, ...] = (
    "password",
    "secret",
    "token",
    "api_key",
    "authorization",
    "cookie",
)
REDACTED = "[redacted]"
TRUNCATION_MARKER = "…[truncated]"
# Deeper structures than this are refused rather than risking a RecursionError mid-walk.
MAX_DEPTH = 200

_WHITESPACE = re.compile(r"\s+")
# One encoder, built once: json.dumps with options builds a new one on every call.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_quote = json.encoder.encode_basestring  # a JSON string literal, as ensure_ascii=False writes
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^a-z0-9]+")


class Digest(NamedTuple):
    """What a record keeps of a value: its fingerprint, a bounded preview and the source length.

    `sha256` is None only for an output that JSON cannot represent (its preview is its repr).
    """

    sha256: str | None
    preview: str
    length: int


def canonical_json(value: Any) -> str:
    """The canonical JSON text of `value`: sorted keys, compact separators, no ASCII escaping.

    Refused with SerializationError: dict keys that are not strings, NaN and Infinity, integers
    too long for Python's int-to-str limit, strings with lone surrogates (not UTF-8), nesting
    deeper than MAX_DEPTH, cycles, and any type other than dict, list, tuple, str, int, float,
    bool and None. Tuples are arrays, exactly like lists.
    """
    return _canonical(value, None)[0]


FastEncoder = Callable[[Any], bytes]


def _canonical(value: Any, fast: FastEncoder | None) -> tuple[str, str]:
    """(canonical JSON text, its SHA-256 hex).

    `fast` may be a sorted-keys compact JSON encoder (msgspec's, passed in by the journal so
    this module needs nothing installed). It is used only for values made of exact str, int
    within 64 bits, bool, None, dict, list and tuple, where its bytes equal the standard
    library's (floats are written differently, so they always take the reference path).
    """
    plain = _check(value, 0)
    if fast is not None and plain:
        try:
            data = fast(value)
            return data.decode("utf-8"), hashlib.sha256(data).hexdigest()
        except Exception:  # lone surrogates and the like: the reference path decides
            pass
    try:
        text = _ENCODER.encode(value)
        return text, hashlib.sha256(text.encode("utf-8")).hexdigest()
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise SerializationError(f"value cannot be stored as JSON: {exc}") from exc


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprint(value: Any) -> str:
    """SHA-256 (hex) over the UTF-8 bytes of canonical_json(value)."""
    return _canonical(value, None)[1]


_PLAIN_SCALARS = (str, bool, type(None))
_CONTAINERS = (dict, list, tuple)
_INT_LIMIT = 2**63


def _check(value: Any, depth: int) -> bool:
    """Refuse what JSON cannot hold; True when the value has only plain types (see _canonical)."""
    if depth > MAX_DEPTH:
        raise SerializationError(f"value is nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return True
    if kind is int:
        return bool(-_INT_LIMIT <= value < _INT_LIMIT)
    if isinstance(value, (str, int)) or value is None:
        return False
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SerializationError("NaN and Infinity cannot be represented in JSON")
        return False
    plain = kind is dict or kind is list or kind is tuple
    if isinstance(value, dict):
        for key, item in value.items():
            if type(key) is not str:
                if not isinstance(key, str):
                    raise SerializationError(
                        f"dict key {key!r} is a {type(key).__name__}; JSON object keys are "
                        "strings")
                plain = False
            if type(item) is not str:  # strings, the commonest values, need no call
                plain = _check(item, depth + 1) and plain
        return plain
    if isinstance(value, (list, tuple)):
        for item in value:
            if type(item) is not str:
                plain = _check(item, depth + 1) and plain
        return plain
    raise SerializationError(f"a {type(value).__name__} cannot be represented in JSON")


# --- redaction ------------------------------------------------------------------------------


class Redactor:
    """Masks, in previews only, the values of dict keys that name a secret.

    A key matches when one of the listed names appears in it as whole words, case-insensitively
    and with camelCase, '-' and other separators read as '_': with "token", `github_token`,
    `X-Auth-Token` and `tokenValue` match and `max_tokens` does not.
    """

    def __init__(self, keys: Iterable[str] = DEFAULT_REDACT_KEYS) -> None:
        if isinstance(keys, str):
            raise TypeError("redact_keys must be a collection of key names, not one string")
        names = []
        for key in keys:
            if not isinstance(key, str) or not _normalise(key).strip("_"):
                raise ValueError(f"redact_keys holds an unusable key name: {key!r}")
            names.append("_" + _normalise(key).strip("_") + "_")
        self.keys: tuple[str, ...] = tuple(names)
        self._matches = lru_cache(maxsize=4096)(self._match)

    def _match(self, key: str) -> bool:
        wrapped = "_" + _normalise(key) + "_"
        return any(name in wrapped for name in self.keys)

    def matches(self, key: str) -> bool:
        return bool(self.keys) and self._matches(key)

    def redact(self, value: Any) -> Any:
        """`value` with matching keys' values masked; the same object when nothing matches."""
        if not self.keys:
            return value
        return self._redact(value, 0)

    def _redact(self, value: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            return value
        if isinstance(value, dict):
            out: dict[Any, Any] | None = None
            for key, item in value.items():
                if isinstance(key, str) and self._matches(key):
                    new: Any = REDACTED
                elif isinstance(item, _CONTAINERS):
                    new = self._redact(item, depth + 1)
                else:
                    continue  # a scalar under an ordinary key stays as it is
                if new is not item and out is None:
                    out = dict(value)
                if out is not None:
                    out[key] = new
            return value if out is None else out
        if isinstance(value, (list, tuple)):
            items = [self._redact(item, depth + 1) if isinstance(item, _CONTAINERS) else item
                     for item in value]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return items
        return value


def _normalise(key: str) -> str:
    return _SEPARATORS.sub("_", _CAMEL.sub("_", key).lower())


# --- previews -------------------------------------------------------------------------------


def collapse(text: str, limit: int) -> tuple[str, bool]:
    """Whitespace runs as one space, stripped; at most `limit` + 1 characters of it are built,
    so a huge text costs what its head costs. Returns (collapsed head, whole text was used)."""
    size = max(64, 2 * limit + 16)
    while True:
        head = text[:size]
        whole = size >= len(text)
        out = _WHITESPACE.sub(" ", head).lstrip()
        if whole:
            return out.rstrip(), True
        if len(out) > limit:
            return out, False
        size *= 4


def _joins_previous(ch: str) -> bool:
    """True for a character that belongs to the one before it: a cut must not fall before it."""
    code = ord(ch)
    if code == 0x200D or 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF:
        return True
    if 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F:  # skin tones, tag characters
        return True
    return unicodedata.category(ch) in ("Mn", "Mc", "Me")


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def safe_cut(text: str, cut: int) -> int:
    """The largest position <= cut that does not split a character, a combining sequence, a
    zero-width-joiner sequence or a flag (pair of regional indicators)."""
    cut = max(0, min(cut, len(text)))
    while 0 < cut < len(text) and (
        _joins_previous(text[cut]) or text[cut - 1] == "\u200d"
    ):
        cut -= 1
    if 0 < cut < len(text) and _is_regional(text[cut]) and _is_regional(text[cut - 1]):
        run = 0
        while cut - run - 1 >= 0 and _is_regional(text[cut - run - 1]):
            run += 1
        if run % 2:
            cut -= 1
    return cut


def preview(text: str, limit: int) -> str:
    """`text` with whitespace collapsed, cut to at most `limit` characters. A cut preview ends
    with TRUNCATION_MARKER; if `limit` is too small for the marker, the marker is cut instead."""
    if len(text) <= limit and _WHITESPACE.search(text) is None:
        return text
    head, whole = collapse(text, limit)
    if whole and len(head) <= limit:
        return head
    if limit <= len(TRUNCATION_MARKER):
        return TRUNCATION_MARKER[:limit]
    cut = safe_cut(head, limit - len(TRUNCATION_MARKER))
    return head[:cut].rstrip() + TRUNCATION_MARKER


def describe_arguments(arguments: Any, limit: int, redactor: Redactor,
                       fast: FastEncoder | None = None) -> Digest:
    """Fingerprint (of the unredacted value) and redacted preview of tool arguments.
    SerializationError when the arguments cannot be stored as JSON."""
    text, digest = _canonical(arguments, fast)
    redacted = redactor.redact(arguments)
    shown = text if redacted is arguments else canonical_json(redacted)
    return Digest(digest, preview(shown, limit), len(shown))


def describe_output(output: Any, limit: int, redactor: Redactor,
                    fast: FastEncoder | None = None) -> Digest:
    """Like describe_arguments, but never raises: the handler already ran, and its result must
    be recorded whatever it is. A string is previewed as its text; a value JSON cannot
    represent gets no fingerprint and a preview of its repr."""
    if output is None:
        return _NONE_DIGEST
    try:
        text, digest = _canonical(output, fast)
    except SerializationError:
        shown = _safe_repr(output)
        return Digest(None, preview(shown, limit), len(shown))
    if isinstance(output, str):
        return Digest(digest, preview(output, limit), len(output))
    redacted = redactor.redact(output)
    shown = text if redacted is output else canonical_json(redacted)
    return Digest(digest, preview(shown, limit), len(shown))


_NONE_DIGEST = Digest(hashlib.sha256(b"null").hexdigest(), "null", 4)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # a broken __repr__ must not lose the record
        return f"<unrepresentable {type(value).__name__}>"


def describe_error(exc: BaseException, limit: int) -> str:
    """`Type: message`, bounded like a preview."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable message>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return preview(text, limit)


def idempotency_key(
    log_id: str, turn_sequence: int, call_id: str, tool: str, arguments_sha256: str
) -> str:
    """Deterministic from its inputs, so a restarted process derives the same key: the first
    32 hex digits of SHA-256 over the canonical JSON array of the five values."""
    for value in (log_id, call_id, tool, arguments_sha256):
        if not isinstance(value, str):
            raise TypeError("idempotency key parts must be strings and an int turn sequence")
    if type(turn_sequence) is not int:
        raise TypeError("turn_sequence must be an int")
    # Exactly canonical_json of the array, built directly: the parts are known types.
    quote = _quote
    material = (f"[{quote(log_id)},{turn_sequence},{quote(call_id)},{quote(tool)},"
                f"{quote(arguments_sha256)}]")
    try:
        return sha256_text(material)[:32]
    except UnicodeEncodeError as exc:
        raise SerializationError(f"idempotency key material is not UTF-8: {exc}") from exc
