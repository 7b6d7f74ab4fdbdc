"""Sessions for the tests of `walj report`, written by the library itself: a root holding a
blocked session, an interrupted turn, a clean session and a damaged one; a session whose every
string (tool names, call ids, outputs' errors, arguments, actors, notes, its directory's
name) is hostile HTML with control characters; and a parser that reads the page back."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from cli_helpers import flip_byte, interrupted, make_journal, record_offset

import walj

# Each would set a marker global if a browser ran it; the browser test checks it stays unset.
SCRIPT_TOOL = "<script>window.__walj_pwned = 1</script>"
IMG_CALL = '"><img src=x onerror="window.__walj_pwned = 2">'
CONTROLS = "\x1b]52;c;ZWNobyBvd25lZA==\x07\x9b2J\u202e\x00\n"
IMG_DIR = "\"><img src=x onerror='window.__walj_pwned=3'>\x1b[2J"
ACTOR = '"><img src=x onerror="window.__walj_pwned = 4">'
NOTE = "</pre><script>window.__walj_pwned = 5</script>" + CONTROLS
# What a page must never hold raw: C0 (but the line feed of the markup), DEL, C1, bidi
# controls and isolates.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# Every element the report writes: anything else came from a log.
TAGS = {"html", "head", "meta", "title", "style", "body", "header", "main", "h1", "h2", "h3",
        "p", "table", "thead", "tbody", "tr", "th", "td", "span", "a", "code", "pre", "section",
        "div", "details", "summary", "dl", "dt", "dd", "strong"}


def blocked_root(root: Path) -> dict[str, Any]:
    """ROOT/blocked (an ambiguous send), ROOT/turn (an interrupted turn), ROOT/clean, and
    ROOT/corrupt (a flipped byte). Returns the blocked execution's id."""
    eid = make_journal(root / "blocked", blocked=True)
    make_journal(root / "turn", interrupted_turn=True)
    make_journal(root / "clean")
    make_journal(root / "corrupt")
    first = sorted((root / "corrupt").glob("seg-*.jsonl"))[0]
    flip_byte(first, record_offset(first, b'"kind":"turn_started"'))
    return {"eid": eid}


def _fetch(q: str) -> str:
    return f"<script>window.__walj_pwned = 6</script>{CONTROLS}{q}"


def _boom(q: str) -> None:
    raise RuntimeError(f"<img src=x onerror=\"window.__walj_pwned = 7\">{CONTROLS}")


def hostile_session(root: Path) -> tuple[Path, str]:
    """A session in a directory named like markup, with one resolved and one open blocker.
    Returns its path and the open blocker's execution id."""
    path = root / IMG_DIR
    tools = {SCRIPT_TOOL: _fetch, "boom" + CONTROLS: _boom}
    with walj.ToolJournal.open(path, tools=tools, sync="never") as journal:
        with journal.turn() as turn:
            turn.dispatch(SCRIPT_TOOL, {"q": "<b>" + CONTROLS}, call_id=IMG_CALL)
            turn.dispatch("boom" + CONTROLS, {"q": "x"}, call_id="c2" + CONTROLS)
        ids = []
        for call in ("c3<i>" + CONTROLS, IMG_CALL + "4"):
            try:
                with journal.turn() as turn:
                    turn.dispatch(SCRIPT_TOOL, {"q": "</td>" + CONTROLS}, call_id=call,
                                  handler=interrupted)
            except KeyboardInterrupt:
                pass
            ids.append(journal.recovery.blockers[-1].execution_id)
            if len(ids) == 1:
                journal.resolve(ids[0], "succeeded", actor=ACTOR, note=NOTE)
    blocker = ids[1]
    assert blocker is not None
    return path, blocker


@dataclass
class Page(HTMLParser):
    """A report read back: its elements, attributes, text, and each session's parts."""

    tags: set[str] = field(default_factory=set)
    attributes: set[str] = field(default_factory=set)
    text: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)  # the sessions table: status, name
    sections: list[tuple[str, str]] = field(default_factory=list)  # (id, status)
    commands: dict[str, list[str]] = field(default_factory=dict)  # section id: resolve commands
    _where: list[str] = field(default_factory=list)
    _section: str = ""
    _cell: list[str] | None = None

    def __post_init__(self) -> None:
        super().__init__(convert_charrefs=True)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes |= {name for name, _ in attrs}
        values = dict(attrs)
        if tag == "section":
            self._section = values["id"] or ""
            self.sections.append((self._section, values["data-status"] or ""))
        if tag == "table" and values.get("class") == "sessions":
            self._where.append("sessions")
        if tag == "tr" and self._where[-1:] == ["sessions"]:
            self.rows.append([])
        if tag == "td" and self._where[-1:] == ["sessions"]:
            self._cell = []
        if tag == "pre" and values.get("class") == "command":
            self._where.append("command")
            self.commands.setdefault(self._section, []).append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self._where[-1:] == ["sessions"]:
            self._where.pop()
        if tag == "pre" and self._where[-1:] == ["command"]:
            self._where.pop()
        if tag == "tr" and self._where[-1:] == ["sessions"] and not self.rows[-1]:
            self.rows.pop()  # the header row
        if tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        if self._where[-1:] == ["command"]:
            self.commands[self._section][-1] += data


def read_page(path: Path) -> tuple[str, Page]:
    raw = path.read_text(encoding="utf-8")
    parsed = Page()
    parsed.feed(raw)
    parsed.close()
    return raw, parsed
