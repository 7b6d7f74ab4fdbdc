"""Fingerprints and previews of tool arguments and outputs: canonical-JSON SHA-256, bounded
whitespace-collapsed previews, and key redaction. Standard library only (the forensic tool)."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any, NamedTuple

from .. import _codec
from ..errors import SerializationError

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
# Containers inside containers, the value's own included. Below the log's own limit
# (_codec.MAX_DEPTH), so that arguments and outputs fit inside a journal record.
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

    What it accepts is what the log stores (the one set of rules in walj._codec): dict with
    str keys, list, tuple (an array, exactly like a list), str, int, float, bool and None,
    nested at most MAX_DEPTH containers deep; subclasses of these as the base value they hold.
    Refused with SerializationError, naming what and where: other types (bytes, sets,
    datetimes, ...), non-string keys, NaN and Infinity, integers of more than 4300 digits,
    strings with lone surrogates (not UTF-8), deeper nesting and cycles.
    """
    return _canonical(value, None, "value")[0]


FastEncoder = Callable[[Any], bytes]


def _canonical(value: Any, fast: FastEncoder | None, root: str) -> tuple[str, str, Any]:
    """(canonical JSON text, its SHA-256 hex, the value as stored: exact types only).

    `fast` may be a sorted-keys compact JSON encoder (msgspec's, passed in by the journal so
    this module needs nothing installed). It is used only for values made of exact str, int
    within 64 bits, bool, None, dict, list and tuple, where its bytes equal the standard
    library's (floats are written differently, so they always take the reference path).
    """
    plain, flags = _codec.check(value, MAX_DEPTH, root)
    if fast is not None and not flags:
        try:
            data = fast(plain)
            return data.decode("utf-8"), hashlib.sha256(data).hexdigest(), plain
        except Exception:  # lone surrogates, a deep call stack: the reference path decides
            pass
    try:
        try:
            text = _ENCODER.encode(plain)
        except RecursionError:  # a deep value on a deep call stack
            from .. import _deepjson  # only now: the forensic rebuild imports a fixed set

            text = _deepjson.dumps(plain, sort_keys=True)
        data = text.encode("utf-8")
    except ValueError as exc:  # a lone surrogate (UnicodeEncodeError), an int over the limit
        _codec.refuse(plain, MAX_DEPTH, root, exc)
    return text, hashlib.sha256(data).hexdigest(), plain


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_CONTAINERS = (dict, list, tuple)


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
            return self._redact_dict(value, depth)
        if isinstance(value, (list, tuple)):
            items = [self._redact(item, depth + 1) if isinstance(item, _CONTAINERS) else item
                     for item in value]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return items
        return value

    def _redact_dict(self, value: dict[Any, Any], depth: int) -> dict[Any, Any]:
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
    SerializationError when the arguments cannot be stored as JSON (a subclass of it,
    walj._codec.NestingError, when they are nested deeper than MAX_DEPTH)."""
    return _redacted_digest(*_canonical(arguments, fast, "arguments"), limit, redactor)


def _redacted_digest(text: str, digest: str, plain: Any, limit: int,
                     redactor: Redactor) -> Digest:
    redacted = redactor.redact(plain)
    shown = text if redacted is plain else canonical_json(redacted)
    return Digest(digest, preview(shown, limit), len(shown))


def describe_output(output: Any, limit: int, redactor: Redactor,
                    fast: FastEncoder | None = None) -> Digest:
    """Like describe_arguments, but never raises an Exception: the handler already ran, and
    its result must be recorded whatever it is. A string is previewed as its text; a value
    JSON cannot represent gets no fingerprint and a preview of its repr."""
    if output is None:
        return _NONE_DIGEST
    try:
        try:
            text, digest, plain = _canonical(output, fast, "output")
        except SerializationError:
            return _unstorable(output, limit)
        if type(plain) is str:
            return Digest(digest, preview(plain, limit), len(plain))
        return _redacted_digest(text, digest, plain, limit, redactor)
    except Exception:  # e.g. redaction on a call stack too deep for the value: the output
        return _unstorable(output, limit)  # is still recorded, as its repr


def _unstorable(output: Any, limit: int) -> Digest:
    shown = _safe_repr(output)
    return Digest(None, preview(shown, limit), len(shown))


_NONE_DIGEST = Digest(hashlib.sha256(b"null").hexdigest(), "null", 4)


def _safe_repr(value: Any) -> str:
    try:
        return str.__str__(repr(value))  # a plain str, whatever __repr__ returned
    except Exception:  # a broken __repr__ must not lose the record
        return f"<unrepresentable {type(value).__name__}>"


FAST_CANONICAL: FastEncoder | None
try:  # the journal runs with msgspec; its sorted encoder makes fingerprints ~10x cheaper
    import msgspec

    FAST_CANONICAL = msgspec.json.Encoder(order="sorted").encode
except (ImportError, TypeError):  # pragma: no cover - without msgspec, the reference encoder
    FAST_CANONICAL = None


ERROR_CHARS = 1200  # an error's text is bounded like a preview


def describe_error(exc: BaseException, limit: int = ERROR_CHARS) -> str:
    """`Type: message`, bounded like a preview."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable message>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return preview(text, limit)


def idempotency_key(log_id: str, call_id: str, tool: str, arguments_sha256: str) -> str:
    """Deterministic from its inputs, so a restarted process derives the same key, whatever
    turn the same call is dispatched in again: the first 32 hex digits of SHA-256 over the
    canonical JSON array [log_id, call_id, tool, arguments_sha256]."""
    for value in (log_id, call_id, tool, arguments_sha256):
        if not isinstance(value, str):
            raise TypeError("idempotency key parts must be strings")
    # Exactly canonical_json of the array, built directly: the parts are known types.
    quote = _quote
    material = f"[{quote(log_id)},{quote(call_id)},{quote(tool)},{quote(arguments_sha256)}]"
    try:
        return sha256_text(material)[:32]
    except UnicodeEncodeError as exc:
        raise SerializationError(f"idempotency key material is not UTF-8: {exc}") from exc
