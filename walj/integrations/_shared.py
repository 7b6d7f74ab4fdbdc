"""What the raw-SDK integrations share: reading SDK objects and dicts alike, and a tool's
answer as the text a provider's tool result carries."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# The documented `output["status"]` of walj's blocked answer (docs/RECOVERY.md, While blocked).
BLOCKED_STATUS = "blocked_interrupted_execution"


def field(value: Any, key: str) -> Any:
    """`value[key]` of a dict, `value.key` of an SDK object; None when absent."""
    if isinstance(value, Mapping):
        return value.get(key)
    return getattr(value, key, None)


def output_text(output: Any) -> str:
    """A `str` as it is; anything else as JSON (objects JSON has no type for as their
    `str()`); when even that fails, its `repr()`."""
    if isinstance(output, str):
        return output
    try:
        return json.dumps(output, ensure_ascii=False, allow_nan=False, default=str)
    except Exception:  # the handler already ran: say what it gave, whatever it is
        pass
    try:
        return repr(output)
    except Exception:
        return f"<unrepresentable {type(output).__name__}>"


def blocked_message(result: Mapping[str, Any]) -> str | None:
    """walj's message when a handle_function_calls result is a blocked call, else None."""
    output = result["output"]
    if (result["error"] is not None and isinstance(output, Mapping)
            and output.get("status") == BLOCKED_STATUS and isinstance(output.get("message"), str)):
        return str(output["message"])
    return None
