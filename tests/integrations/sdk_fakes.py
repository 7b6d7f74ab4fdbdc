"""Test helpers for the SDK integrations: a scripted model behind httpx2.MockTransport, the
real Anthropic and OpenAI clients on it (nothing leaves the process), and the agent loops.

The SDKs are built on `httpx2` (httpx's API under another name); an SDK built on httpx works
the same, so whichever is installed is used.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import walj

try:
    import httpx2
except ImportError:  # an SDK built on httpx
    import httpx as httpx2  # type: ignore[no-redef]

if TYPE_CHECKING:  # each SDK is imported by the functions that use it, so that the tests of
    import anthropic  # one SDK do not pay for importing the other
    import openai

MODEL = "scripted-model"
ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().parent / "sdk_crash_child.py"
HANG_GUARD = 60.0  # seconds; only stops a broken child from hanging the run


class ScriptedModel:
    """A model server: answers each request with the next canned JSON body, in order, and
    keeps every request's JSON body. A request beyond the script gets a 400 (the clients are
    built without retries, so the loop fails at once)."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.urls: list[str] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.urls.append(str(request.url))
        self.requests.append(json.loads(request.content))
        if not self.replies:
            return httpx2.Response(400, json={"error": {"message": "the script has ended"}})
        return httpx2.Response(200, json=self.replies.pop(0))

    def http_client(self) -> httpx2.Client:
        return httpx2.Client(transport=httpx2.MockTransport(self))


# --- Anthropic Messages ---------------------------------------------------------------------


def anthropic_client(model: ScriptedModel) -> anthropic.Anthropic:
    import anthropic

    return anthropic.Anthropic(api_key="offline", http_client=model.http_client(),
                               max_retries=0)


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use(block_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": block_id, "name": name, "input": arguments}


def message(*blocks: dict[str, Any]) -> dict[str, Any]:
    """A Messages API response body; stop_reason follows from the blocks."""
    uses = any(block["type"] == "tool_use" for block in blocks)
    return {"id": "msg_scripted", "type": "message", "role": "assistant", "model": MODEL,
            "content": list(blocks), "stop_reason": "tool_use" if uses else "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}


def anthropic_loop(client: anthropic.Anthropic, messages: list[Any], registry: Any,
                   journal: walj.ToolJournal | None, rounds: int = 4) -> str:
    """The agent loop: ask the model, answer its tool_use blocks, until it stops asking.
    Returns the final text."""
    from walj.integrations.anthropic import handle_tool_uses

    for _ in range(rounds):
        response = client.messages.create(model=MODEL, max_tokens=256, messages=messages)
        messages.append({"role": "assistant", "content": response.content})
        results = handle_tool_uses(response.content, registry, journal)
        if not results:
            return "".join(getattr(block, "text", "") for block in response.content)
        messages.append({"role": "user", "content": results})
    raise AssertionError("the model never stopped asking for tools")


def sent_tool_results(model: ScriptedModel, request: int) -> list[dict[str, Any]]:
    """The tool_result blocks that request number `request` carried, as sent on the wire."""
    last = model.requests[request]["messages"][-1]
    assert last["role"] == "user"
    return list(last["content"])


# --- OpenAI Responses -----------------------------------------------------------------------


def openai_client(model: ScriptedModel) -> openai.OpenAI:
    import openai

    return openai.OpenAI(api_key="offline", http_client=model.http_client(), max_retries=0)


def function_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A function_call output item; `arguments` that are not text are sent as JSON text."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": text, "status": "completed"}


def output_message(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_scripted", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def response(*items: dict[str, Any]) -> dict[str, Any]:
    """A Responses API response body."""
    return {"id": "resp_scripted", "object": "response", "created_at": 0, "model": MODEL,
            "status": "completed", "output": list(items), "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": []}


def openai_loop(client: openai.OpenAI, items: list[Any], registry: Any,
                journal: walj.ToolJournal | None, rounds: int = 4) -> str:
    """The agent loop on the Responses API. Returns the final text."""
    from walj.integrations.openai import handle_response_calls

    for _ in range(rounds):
        reply = client.responses.create(model=MODEL, input=items)
        items.extend(reply.output)
        outputs = handle_response_calls(reply.output, registry, journal)
        if not outputs:
            return reply.output_text
        items.extend(outputs)
    raise AssertionError("the model never stopped asking for tools")


def sent_call_outputs(model: ScriptedModel, request: int) -> list[dict[str, Any]]:
    """The function_call_output items that request number `request` added to the input since
    the request before it, as sent on the wire."""
    before = len(model.requests[request - 1]["input"]) if request > 0 else 0
    return [item for item in model.requests[request]["input"][before:]
            if item.get("type") == "function_call_output"]


# --- the crash child ------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment of a child process: this checkout of walj first on its path."""
    rest = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + rest if rest else ""))


def run_child(provider: str, journal: Path, effects: Path, mode: str) -> None:
    """Run sdk_crash_child.py. MODE "kill": SIGKILL it once it says it is inside send_refund;
    MODE "clean": let it finish. Either way, check that it did what was asked."""
    env = child_env()
    child = subprocess.Popen([sys.executable, str(CHILD), provider, str(journal), str(effects),
                              mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT, env=env)
    assert child.stdout is not None and child.stderr is not None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(child.stdout, selectors.EVENT_READ)
            assert selector.select(HANG_GUARD), "the child said nothing"
            line = child.stdout.readline().strip()
        expected = "IN_HANDLER" if mode == "kill" else "DONE"
        if line != expected:
            child.kill()
            child.wait()
            raise AssertionError((line, child.stderr.read()))
        if mode == "kill":
            os.kill(child.pid, signal.SIGKILL)
        child.wait(HANG_GUARD)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == (-signal.SIGKILL if mode == "kill" else 0)


def effect_lines(effects: Path) -> list[str]:
    return effects.read_text(encoding="utf-8").splitlines() if effects.exists() else []


def check_import_isolation(monkeypatch: Any, sdk: str, module: str | None = None,
                           extra: str | None = None) -> None:
    """`import walj` imports neither `walj.integrations.<module>` nor the SDK, and importing
    the integration without the SDK raises an ImportError that names the extra `walj[<extra>]`.
    `module` and `extra` default to the SDK's name."""
    import importlib
    import re

    import pytest

    module, extra = module or sdk, extra or sdk
    script = ("import sys, walj\n"
              f"print(sorted(m for m in sys.modules if m == {sdk!r}"
              " or m.startswith('walj.integrations')))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, check=True, timeout=120)
    assert done.stdout.strip() == "[]"
    monkeypatch.setitem(sys.modules, sdk, None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, f"walj.integrations.{module}")
    with pytest.raises(ImportError, match=re.escape(f"pip install 'walj[{extra}]'")):
        importlib.import_module(f"walj.integrations.{module}")
