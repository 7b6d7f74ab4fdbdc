"""What a journal was opened with, fixed for its life: its tools, previews and redaction, what
its records store (and the bound on stored outputs), when it checkpoints, and how it reads its
own log back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._fingerprint import Redactor
from ._tools import Tool

DEFAULT_MAX_STORED_OUTPUT_BYTES = 64 * 1024
DEFAULT_MAX_RECORD_BYTES = 2**20  # walj.Log.open's default
DEFAULT_CHECKPOINT_EVERY = 100_000
# Room in an ok call's terminal record for everything but the output value: its fixed fields
# and the output preview, each of whose characters JSON may write as up to 6 bytes (\u001f).
_TERMINAL_RECORD_ROOM = 1024


def output_limit(wanted: int, preview_chars: int, max_record_bytes: Any) -> int:
    """`wanted`, or less when a record of that size could not fit the log."""
    if type(max_record_bytes) is not int:
        return wanted  # Log.open refuses it with its own message
    room = max_record_bytes - _TERMINAL_RECORD_ROOM - 6 * preview_chars
    if room < 1:
        raise ValueError(f"max_record_bytes {max_record_bytes} leaves no room to store outputs "
                         f"beside a {preview_chars}-character output preview")
    return min(wanted, room)


@dataclass(frozen=True)
class Options:
    tools: Mapping[str, Tool]
    arguments_chars: int  # argument preview length
    output_chars: int  # output preview length
    redactor: Redactor
    store_arguments: bool
    block_on_pending_llm_calls: bool
    # The largest output (in JSON bytes) an ok call's terminal record stores, or None when
    # outputs are not stored.
    stored_output_limit: int | None = None
    read_options: dict[str, Any] = field(default_factory=dict)  # for walj.read
    record_limit: int = 2**20  # the log's max_record_bytes: a checkpoint part's
    checkpoint_every: int | None = None  # records between automatic checkpoints
    # Whether a `release` request from another process closes this journal when idle; a
    # callable is asked, at each idle moment, whether it may (its owner's runs, say).
    release_on_request: bool | Callable[[], bool] = False
