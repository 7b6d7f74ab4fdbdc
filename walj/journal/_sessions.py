"""Session ids to directory names: any non-empty text names a session, and maps to one safe,
collision-free directory name under the sessions' root."""

from __future__ import annotations

import hashlib
import re
import string
from typing import Any

# Ids made only of these, 1-128 characters, not starting with '.' or '-', are their own
# directory name (as in every walj before any other id was accepted).
_SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+=-]{0,127}")
_KEPT = frozenset(string.ascii_letters + string.digits + "_.@+=-")
# Every other id is "%" followed by its percent-encoded UTF-8 (every byte outside _KEPT as %XX,
# '%' itself included): no safe id starts with '%', and percent-encoding is one-to-one. An
# encoding longer than ENCODED_MAX keeps its first HASHED_PREFIX characters, then "~" (which
# the encoding always escapes, so no short form holds it) and the SHA-256 of the id's UTF-8.
ENCODED_MARK = "%"
HASHED_MARK = "~"
ENCODED_MAX = 200  # ASCII characters: well inside the 255-byte name limit of file systems
HASHED_PREFIX = 120


def check_session_id(session_id: Any) -> str:
    """Refuse, with ValueError, anything but non-empty text that UTF-8 can encode (a lone
    surrogate cannot be stored or named). Any other text is a session id, NUL included."""
    if not isinstance(session_id, str):
        raise ValueError(f"session id must be a string, not {type(session_id).__name__}")
    if not session_id:
        raise ValueError("session id is empty")
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("session id is not valid Unicode text: it holds a lone surrogate, "
                         "which cannot be stored as UTF-8") from None
    return str(session_id)  # a str subclass names the session by its text alone


def directory_name(session_id: str) -> str:
    """The directory name of a checked session id: a safe id as it is, else its encoding."""
    if _SAFE_ID.fullmatch(session_id):
        return session_id
    encoded = ENCODED_MARK + "".join(
        char if char in _KEPT else "".join(f"%{byte:02X}" for byte in char.encode("utf-8"))
        for char in session_id)
    if len(encoded) <= ENCODED_MAX:
        return encoded
    prefix = encoded[:HASHED_PREFIX]
    escape = prefix.rfind("%", len(prefix) - 2)
    if escape > 0:  # never cut an escape in two
        prefix = prefix[:escape]
    digest = hashlib.sha256(session_id.encode("utf-8")).hexdigest()
    return prefix + HASHED_MARK + digest
