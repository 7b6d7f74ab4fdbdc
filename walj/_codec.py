"""JSON for stored values: the one set of rules for what a value may hold (records and
fingerprints alike), and encoding and decoding with msgspec when installed, the standard
library otherwise."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NoReturn

from .errors import SerializationError

try:  # The forensic zipapp runs with the standard library alone.
    import msgspec

    _encoder: msgspec.json.Encoder | None = msgspec.json.Encoder()
    _decoder: msgspec.json.Decoder[Any] | None = msgspec.json.Decoder()
    _DecodeError: type[Exception] = msgspec.DecodeError
except ImportError:  # pragma: no cover - exercised by the zipapp tests
    _encoder = None
    _decoder = None
    _DecodeError = ValueError

HAVE_MSGSPEC = _encoder is not None


MAX_DEPTH = 256  # containers inside containers, the record's own included; deeper is refused

# --- what a value may hold -------------------------------------------------------------------
#
# Exactly what JSON gives back unchanged: dict with str keys, list, tuple (read back as a list),
# str, int, float, bool and None. Anything an encoder would convert (msgspec writes bytes as
# base64, sets as lists, datetimes and UUIDs as strings, int keys as text, NaN as null) is
# refused, so what is read back always equals what was written. Subclasses of str, int, float,
# dict, list and tuple (IntEnum, a str-valued Enum, OrderedDict) are stored as the base value
# they hold, read from their own storage, never through overridden methods.

# Flags of `check`: what a valid value holds besides exact str, int within 64 bits, bool, None,
# dict, list and tuple. The fingerprint's fast encoder is used only when there are none.
FLOAT = 1
BIG_INT = 2
CONVERT = 4  # a subclass somewhere: `check` hands back a copy made of exact types

MAX_INT_DIGITS = 4300  # Python's default int-to-text limit: every reader can parse the digits
_SAFE_BITS = 14_000  # an int this wide has fewer than MAX_INT_DIGITS digits
_INT64 = 2**63
_INF = float("inf")
_CONTAINERS = (dict, list, tuple)
_EXACT_CONTAINERS = frozenset(_CONTAINERS)


class NestingError(SerializationError):
    """Refused for being nested more containers deep than the limit (or for holding itself)."""


class _Refused(Exception):
    """A rule refused a value; `reason` says why, and the careful walk adds where."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


def check(value: Any, limit: int, root: str) -> tuple[Any, int]:
    """(what to encode, flags) for `value`, nested at most `limit` containers deep; else
    SerializationError naming what was refused and where (`record["a"][3] is of type set`).
    What to encode is `value` itself unless it holds subclasses (flag CONVERT)."""
    try:
        flags = (_scan(value, 1, limit) if type(value) in _EXACT_CONTAINERS
                 else _other_flags(value, 1, limit))
    except (_Refused, RecursionError):  # RecursionError: a deep value on a deep call stack
        flags = -1
    if flags < 0:
        flags = _walk(value, limit, root)
    if flags & CONVERT:
        value = _plain(value)
    return value, flags


def refuse(value: Any, limit: int, root: str, exc: BaseException) -> NoReturn:
    """After an encoder refused a checked value (a lone surrogate): say what and where."""
    _walk(value, limit, root)
    raise SerializationError(f"{root} cannot be stored as JSON: {exc}") from exc


def _scan(container: Any, level: int, limit: int) -> int:
    """The fast twin of _walk for an exact dict, list or tuple, the `level`-th container down:
    the commonest values inline, the rest by the shared rules, no path kept (on _Refused the
    careful walk says where). This runs on every append."""
    if level > limit:
        raise _Refused()
    flags = 0
    if type(container) is dict:
        for key in container:
            if type(key) is not str:
                flags = _key_flags(list(container))
                break
        container = container.values()
    for item in container:
        kind = type(item)
        if kind is str or item is None or kind is bool:
            continue
        if kind is int:
            if -_INT64 <= item < _INT64:
                continue
        elif kind is float:
            if -_INF < item < _INF:
                flags |= FLOAT
                continue
        elif kind in _EXACT_CONTAINERS:
            flags |= _scan(item, level + 1, limit)
            continue
        flags |= _other_flags(item, level + 1, limit)
    return flags


def _other_flags(item: Any, level: int, limit: int) -> int:
    """The rule for all but an exact dict, list or tuple (`level`: where a container is)."""
    if issubclass(type(item), _CONTAINERS):
        return _scan_subclass(item, level, limit)
    return _scalar_flags(item)


def _scan_subclass(container: Any, level: int, limit: int) -> int:
    if issubclass(type(container), dict):
        flags = _key_flags(list(dict.keys(container)))
        return flags | _scan(list(dict.values(container)), level, limit) | CONVERT
    return _scan(_items(container), level, limit) | CONVERT


def _items(sequence: Any) -> list[Any]:
    """The items a list or tuple (or subclass) holds, without its own __iter__."""
    if issubclass(type(sequence), list):
        return list(list.__iter__(sequence))
    return list(tuple.__iter__(sequence))


def _scalar_flags(item: Any) -> int:
    """The rule for a value that is not a container."""
    kind = type(item)
    if kind is str or kind is bool or item is None:
        return 0
    if kind is int or kind is float:
        return _number_flags(item)
    if issubclass(kind, str):
        return CONVERT
    if issubclass(kind, int):  # IntEnum, IntFlag and the like: stored as the int they are
        return _number_flags(int.__int__(item)) | CONVERT
    if issubclass(kind, float):
        return _number_flags(float.__float__(item)) | CONVERT
    if issubclass(kind, (bytes, bytearray, memoryview)):
        hint = "JSON has no bytes (they would be read back as base64 text)"
    elif issubclass(kind, (set, frozenset)):
        hint = "JSON has no sets (it would be read back as a list)"
    else:
        hint = "JSON would store it as a string or a plain object, not as what it is"
    raise _Refused(f"is of type {_type_name(kind)}: {hint}; store dict, list, str, int, "
                   "float, bool or None")


def _number_flags(number: Any) -> int:
    """The rule for an exact int or float."""
    if type(number) is float:
        if -_INF < number < _INF:
            return FLOAT
        raise _Refused(f"is {number!r}, which JSON cannot represent")
    if -_INT64 <= number < _INT64:
        return 0
    if number.bit_length() > _SAFE_BITS and not _few_digits(number):
        raise _Refused(f"is an integer of more than {MAX_INT_DIGITS} digits, more than every "
                       "reader can parse")
    return BIG_INT


def _few_digits(number: int) -> bool:
    try:
        return len(int.__repr__(abs(number))) <= MAX_INT_DIGITS
    except ValueError:  # over this process's own int-to-text limit
        return False


def _key_flags(keys: list[Any]) -> int:
    """The rule for a dict's keys: strings only, no two of them the same text."""
    flags = 0
    for key in keys:
        if type(key) is not str:
            if not issubclass(type(key), str):
                raise _Refused(
                    f"has the key {_show(key)} of type {_type_name(type(key))}: JSON object keys "
                    "are strings, so it would be read back as text (and lost beside an equal "
                    "string key)")
            flags = CONVERT
    if flags and len({str.__str__(key) for key in keys}) < len(keys):
        raise _Refused("has two keys that are the same text")
    return flags


def _text_ok(text: str, what: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _Refused(f"{what} a lone surrogate, which is not UTF-8") from None


def _walk(value: Any, limit: int, root: str) -> int:
    """The rules applied one value at a time, keeping the path, on a stack of its own: the
    flags, or SerializationError (NestingError for depth) naming what was refused and where."""
    flags = 0
    work: list[tuple[Any, int, Any]] = [(value, 1, None)]  # (value, its level, its trail)
    while work:
        item, level, trail = work.pop()
        kind = type(item)
        try:
            if not issubclass(kind, _CONTAINERS):
                flags |= _scalar_flags(item)
                if issubclass(kind, str):
                    _text_ok(str.__str__(item), "holds")
                continue
            if level > limit:
                raise NestingError(f"{_path(root, trail)} is nested more than {limit} "
                                   "containers deep (or holds itself)")
            if not (kind is dict or kind is list or kind is tuple):
                flags |= CONVERT
            if issubclass(kind, dict):
                keys = list(dict.keys(item))
                flags |= _key_flags(keys)
                for key in keys:
                    _text_ok(str.__str__(key), "has a key that holds")
                children: list[tuple[Any, Any]] = list(
                    zip([str.__str__(key) for key in keys], dict.values(item), strict=True))
            else:
                children = list(enumerate(_items(item)))
        except _Refused as exc:
            raise SerializationError(f"{_path(root, trail)} {exc.reason}") from None
        work.extend((child, level + 1, (trail, key)) for key, child in reversed(children))
    return flags


def _path(root: str, trail: Any) -> str:
    """`root["a"][3]`: where a refused value is. A very deep path keeps its two ends."""
    steps: list[str] = []
    while trail is not None:
        trail, key = trail
        if type(key) is int:
            steps.append(f"[{key}]")
        else:
            shown = key if len(key) <= 40 else key[:40] + "…"
            steps.append(f"[{json.encoder.encode_basestring(shown)}]")
    steps.reverse()
    if len(steps) > 12:
        steps[6:-6] = [f"…{len(steps) - 12} more…"]
    return root + "".join(steps)


def _show(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the refusal
        return f"<unrepresentable {_type_name(type(value))}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(kind: type) -> str:
    module = getattr(kind, "__module__", "builtins")
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _plain(value: Any) -> Any:
    """A copy of a checked value made of exact types: subclasses as the base values they hold
    (read from their own storage, as the rules read them), tuples as lists."""
    top: list[Any] = [None]
    work: list[tuple[Any, Any, Any]] = [(top, 0, value)]
    while work:
        slot, key, item = work.pop()
        kind = type(item)
        new: Any
        if kind is str or kind is bool or item is None or kind is int or kind is float:
            new = item
        elif issubclass(kind, dict):
            new = {}
            for name, child in dict.items(item):
                name = str.__str__(name)
                new[name] = None
                work.append((new, name, child))
        elif issubclass(kind, (list, tuple)):
            new = _items(item)
            work.extend((new, index, child) for index, child in enumerate(new))
        elif issubclass(kind, str):
            new = str.__str__(item)
        elif issubclass(kind, int):
            new = int.__int__(item)
        else:
            new = float.__float__(item)
        slot[key] = new
    return top[0]


# --- encoding --------------------------------------------------------------------------------


_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _json_bytes(value: Any) -> bytes:
    return _JSON_ENCODER.encode(value).encode("utf-8")


_encode_plain: Callable[[Any], bytes] = _encoder.encode if _encoder is not None else _json_bytes


def encode(value: Any) -> bytes:
    """Compact JSON bytes of `value`; SerializationError, naming what and where, for anything
    JSON would not give back unchanged, or nested deeper than MAX_DEPTH containers."""
    # `check` inlined for the commonest record, an exact dict of exact types: this is the
    # append hot path. Anything else, refusals included, goes through `check` itself.
    plain = value
    try:
        flags = _scan(value, 1, MAX_DEPTH) if type(value) is dict else CONVERT
    except (_Refused, RecursionError):
        flags = CONVERT
    if flags & CONVERT:
        plain, flags = check(value, MAX_DEPTH, "record")
    try:
        return _encode_plain(plain)
    except RecursionError:  # a deep record on a deep call stack
        pass
    except ValueError as exc:  # a lone surrogate (UnicodeEncodeError), an int over the limit
        refuse(plain, MAX_DEPTH, "record", exc)
    from . import _deepjson  # only now: the forensic rebuild imports a small, fixed set

    try:
        return _deepjson.dumps(plain).encode("utf-8")
    except ValueError as exc:
        refuse(plain, MAX_DEPTH, "record", exc)


# --- decoding --------------------------------------------------------------------------------


def _json_loads(data: bytes | memoryview) -> Any:
    return json.loads(bytes(data))


# The installed parser. It recurses, so it needs call stack in proportion to the nesting.
_parse: Callable[[bytes | memoryview], Any] = (
    _decoder.decode if _decoder is not None else _json_loads)


def _decode(data: bytes | memoryview) -> Any:
    """Parse JSON bytes; _DecodeError on bad JSON. A record nested up to MAX_DEPTH deep is
    legal, so it must read back from any caller, however little stack that caller has left."""
    try:
        return _parse(data)
    except RecursionError:
        pass
    from . import _deepjson  # only now: the forensic rebuild imports a small, fixed set

    try:
        return _deepjson.loads(data)
    except ValueError as exc:
        raise _DecodeError(str(exc)) from None


def raw_decoder() -> tuple[Callable[[bytes], Any], type[Exception]]:
    """The fastest decode function and the exception it raises on bad JSON, for hot loops
    that convert that exception themselves."""
    return _decode, _DecodeError


def decode(data: bytes | memoryview) -> Any:
    """Parse JSON bytes; ValueError on anything that is not one JSON value."""
    try:
        return _decode(data)
    except _DecodeError as exc:
        raise ValueError(str(exc)) from exc


def _depth(value: Any) -> int:
    """How many containers deep `value` is, counted up to just past MAX_DEPTH (callers only
    compare it with MAX_DEPTH). Its own stack, like the rest of the reading path."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            break
        # Only containers go on the stack: a long list of strings costs one pass, not a push
        # and a pop each.
        stack.extend((child, level + 1) for child in children
                     if isinstance(child, (dict, list, tuple)))
    return deepest
