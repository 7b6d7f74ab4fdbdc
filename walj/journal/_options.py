"""What a journal was opened with: its tools, previews and redaction, what its records store,
when it checkpoints, and how it reads its own log back. Fixed for the journal's life."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._fingerprint import Redactor
from ._tools import Tool


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
