"""The line format: how one record, segment header or seal is framed, checksummed and parsed.

The code twin of docs/FORMAT.md: its *Lines* section (the byte layout, the three line shapes,
the header's fields and bounds, the seal, the base marker's line) and the names of *Files in a
log directory* are spelled here and nowhere else in walj; each statement of those sections was
checked against this module, and a change to one is a change to the other.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _codec
from .._codec import encode as _encode
from ..errors import RecordTooLargeError, SerializationError, UnsupportedVersionError

__all__ = ["BASE_NAME", "BASE_TAG", "BASE_TMP", "FORMAT_VERSION", "HEADER_LINE_LIMIT",
           "LINE_OVERHEAD", "LOCK_NAME", "MANIFEST", "MAX_RECORD_BYTES_LIMIT", "OWNER_NAME",
           "PURE_XXH64", "QUARANTINE_DIR", "SEAL_LINE_LIMIT", "SEGMENT_RE", "SEGMENT_TMP_SUFFIX",
           "Header", "Seal", "check_encoded", "checksum", "checksum_ok", "encode_record", "frame",
           "frame_record", "frame_records", "parse_data", "parse_header", "parse_seal",
           "segment_index", "segment_name"]

xxh64_intdigest: Callable[[bytes | memoryview], int]

try:
    from xxhash import xxh64_intdigest

    PURE_XXH64 = False
except ImportError:  # the forensic zipapp verifies with the pure-Python implementation
    from ._xxh64 import xxh64_intdigest as _pure_xxh64

    xxh64_intdigest = _pure_xxh64
    PURE_XXH64 = True

FORMAT_VERSION = 1

# A line is PREFIX + 16 lowercase hex digits of XXH64(body) + b'",' + body + b"\n", where body is
# the rest of a JSON object. The checksum covers body exactly as stored: checking it needs no
# re-encoding, and the line stays one JSON object that jq or any parser reads.
PREFIX = b'{"xxh64":"'
CHECKSUM_END = len(PREFIX) + 16
BODY_START = CHECKSUM_END + 2
SEQ_TAG = b'"seq":'
DATA_TAG = b',"data":'
HEADER_TAG = b'"header":'
SEAL_TAG = b'"seal":'
BASE_TAG = b'"base":'  # the one line of BASE
# A data line's body up to its record, with the seq to fill in; and a line's start up to its
# body, with the checksum to fill in. The append path and the reader's hot loop format them.
RECORD_TAG = SEQ_TAG + b"%d" + DATA_TAG
FRAME_HEAD = PREFIX + b'%016x",'
_RECORD_BODY = RECORD_TAG + b"%b}"
_LINE = FRAME_HEAD + b"%b\n"

# Bytes a data line adds around the record's JSON: prefix, checksum, seq of up to 20 digits, tags.
LINE_OVERHEAD = 128
HEADER_LINE_LIMIT = 64 * 1024
MAX_RECORD_BYTES_LIMIT = 256 * 2**20

# A seal line is under 200 bytes (three numbers and a digest); a longer last line is not one.
SEAL_LINE_LIMIT = 1024

# The files of a log directory besides its segments.
SEGMENT_RE = re.compile(r"^seg-(\d{10})\.jsonl$")
SEGMENT_TMP_SUFFIX = ".tmp"  # a segment being created by a rotation: header only
BASE_NAME = "BASE"
BASE_TMP = "BASE.tmp"
LOCK_NAME = "LOCK"
OWNER_NAME = "LOCK.owner"
QUARANTINE_DIR = "quarantine"
MANIFEST = "MANIFEST.jsonl"  # in QUARANTINE_DIR


def segment_name(index: int) -> str:
    return f"seg-{index:010d}.jsonl"


def segment_index(name: str) -> int | None:
    match = SEGMENT_RE.match(name)
    return int(match.group(1)) if match else None


def checksum(body: bytes | memoryview) -> bytes:
    return b"%016x" % xxh64_intdigest(body)


def frame(body: bytes) -> bytes:
    """Turn a body (the JSON object without its opening brace) into one checksummed line."""
    return _LINE % (xxh64_intdigest(body), body)


def frame_record(seq: int, data: bytes) -> bytes:
    """The whole line for record `seq` whose JSON is `data`: `frame` with the body inlined,
    because this is the append hot path."""
    body = _RECORD_BODY % (seq, data)
    return _LINE % (xxh64_intdigest(body), body)


def frame_records(first_seq: int, datas: Sequence[bytes]) -> bytes:
    """`frame_record` of each of `datas`, numbered from `first_seq`, joined: one C-level map
    per step, for a batch."""
    seqs = range(first_seq, first_seq + len(datas))
    bodies = list(map(_RECORD_BODY.__mod__, zip(seqs, datas, strict=True)))
    return b"".join(map(_LINE.__mod__, zip(map(xxh64_intdigest, bodies), bodies, strict=True)))


def check_encoded(bodies: Sequence[bytes], max_record: int) -> None:
    """Refuse, before anything is written, records said to be already encoded that are not
    what `encode_record` returns: each one JSON object on one line (SerializationError), each
    within `max_record` bytes (RecordTooLargeError). Only the framing's own needs are checked:
    the caller encoded them."""
    if not bodies:
        raise SerializationError("append_encoded needs at least one record")
    for body in bodies:
        if type(body) is not bytes or body[:1] != b"{" or body[-1:] != b"}" or b"\n" in body:
            raise SerializationError("append_encoded takes the bytes encode_record "
                                     "returned, one record each")
        if len(body) > max_record:
            raise RecordTooLargeError(
                f"record is {len(body)} bytes; max_record_bytes is {max_record}")


def encode_record(record: Any) -> bytes:
    """The JSON bytes of a record's data; SerializationError, naming what and where, if it is
    not a dict or holds anything JSON would not give back unchanged (the rules of _codec)."""
    # By type, not isinstance: an object that only claims dict as its __class__ is not one.
    if type(record) is dict or issubclass(type(record), dict):
        return _encode(record)
    raise SerializationError(f"a record must be a dict, not {type(record).__name__}")


def checksum_ok(line: bytes) -> bool:
    """True when `line` (without its newline) is framed and its checksum matches its body."""
    return (
        line.startswith(PREFIX)
        and line[CHECKSUM_END:BODY_START] == b'",'
        and line[len(PREFIX) : CHECKSUM_END] == checksum(memoryview(line)[BODY_START:])
    )


def parse_data(line: bytes) -> tuple[int, bytes] | None:
    """(seq, data JSON bytes) of a checksummed data line, or None if it is not a data line."""
    if line[BODY_START : BODY_START + 6] != SEQ_TAG or not line.endswith(b"}"):
        return None
    comma = line.find(b",", BODY_START + 6, BODY_START + 30)
    if comma < 0 or line[comma : comma + 8] != DATA_TAG:
        return None
    digits = line[BODY_START + 6 : comma]
    data = line[comma + 8 : -1]
    if not digits.isdigit() or not data.startswith(b"{"):
        return None
    return int(digits), data


@dataclass(frozen=True)
class Header:
    """The first line of every segment."""

    version: int
    log_id: str
    index: int
    first_seq: int
    prev_seal: str
    max_record_bytes: int
    created: float

    def body(self) -> bytes:
        fields = {
            "v": self.version,
            "log": self.log_id,
            "seg": self.index,
            "first": self.first_seq,
            "prev": self.prev_seal,
            "max_record": self.max_record_bytes,
            "created": self.created,
        }
        return HEADER_TAG + _codec.encode(fields) + b"}"


@dataclass(frozen=True)
class Seal:
    """The last line of a segment that rotation closed: a digest of every byte before it."""

    last_seq: int
    records: int
    sha256: str

    def body(self) -> bytes:
        fields = {"last": self.last_seq, "records": self.records, "sha256": self.sha256}
        return SEAL_TAG + _codec.encode(fields) + b"}"


def _tagged_fields(line: bytes, tag: bytes) -> dict[str, Any] | None:
    if line[BODY_START : BODY_START + len(tag)] != tag or not line.endswith(b"}"):
        return None
    try:
        fields = _codec.decode(line[BODY_START + len(tag) : -1])
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


def parse_header(line: bytes) -> Header | None:
    """The header of a checksummed header line; None if malformed; refuses unknown versions."""
    fields = _tagged_fields(line, HEADER_TAG)
    if fields is None:
        return None
    version = fields.get("v")
    if version != FORMAT_VERSION:
        raise UnsupportedVersionError(
            f"segment format version {version!r} is not supported (this walj reads "
            f"version {FORMAT_VERSION})",
            kind="unsupported_version",
        )
    try:
        header = Header(
            version=version,
            log_id=str(fields["log"]),
            index=int(fields["seg"]),
            first_seq=int(fields["first"]),
            prev_seal=str(fields["prev"]),
            max_record_bytes=int(fields["max_record"]),
            created=float(fields["created"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
    if header.first_seq < 1 or header.index < 1:
        return None
    # Readers hold a line of up to max_record bytes in memory: a forged 2**40 would let one
    # segment take all of it. No writer can write more than the limit, so more is not a header.
    if not 1 <= header.max_record_bytes <= MAX_RECORD_BYTES_LIMIT:
        return None
    return header


def parse_seal(line: bytes) -> Seal | None:
    fields = _tagged_fields(line, SEAL_TAG)
    if fields is None:
        return None
    try:
        return Seal(int(fields["last"]), int(fields["records"]), str(fields["sha256"]))
    except (KeyError, TypeError, ValueError):
        return None
