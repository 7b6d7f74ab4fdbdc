"""The HTML of `walj report`: escaping (every string from a log is hostile), the page around
the sessions, its style sheet, and the table that lists every session."""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ._common import clock, duration, printable

# Every string from a log is cut to TEXT characters (LONG for an arguments preview, an error or
# a note; PATH for a path or URL) before it is escaped: each character becomes at most six
# (`\u202e`), so every cell of the page is bounded.
TEXT = 120
LONG = 300
PATH = 400

STATUS_RANK = {"blocked": 0, "corrupt": 1, "unsupported": 2, "unreadable": 3, "active": 4,
               "ended": 5}

# No script, and nothing fetched: the page is read from a file, and a string that escaped its
# escaping still could not run (the browser refuses it, and says so on its console).
POLICY = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; script-src 'none'; "
          "base-uri 'none'; form-action 'none'")

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2430;
background:#f6f7f9}
header,main{padding:12px 24px}header{background:#1d2430;color:#fff}
header h1{margin:0 0 4px;font-size:20px}header p{margin:2px 0;color:#cfd6e0}
h2{font-size:17px;margin:18px 0 8px}h3{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;width:100%;background:#fff;margin-bottom:8px}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #e3e6ea;vertical-align:top;
overflow-wrap:anywhere}td{min-width:4.5em}td.n{min-width:0}
th{background:#eef0f3;font-weight:600;white-space:nowrap}td.n{text-align:right}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
pre.command{background:#101820;color:#e6edf3;padding:6px 10px;margin:4px 0 10px;
white-space:pre-wrap;overflow-wrap:anywhere;user-select:all}
.status{display:inline-block;white-space:nowrap;padding:0 6px;border-radius:3px;
font-weight:600;font-size:12px;text-transform:uppercase}
.st-blocked,.o-bad{background:#c62828;color:#fff}.st-corrupt,.st-unsupported,.st-unreadable{
background:#8e24aa;color:#fff}.st-active{background:#2e7d32;color:#fff}
.st-ended{background:#607d8b;color:#fff}.o-ok{color:#2e7d32;font-weight:600}
.o-warn{color:#b26a00;font-weight:600}.o-bad{padding:0 4px;border-radius:3px}
section.session{background:#fff;border:1px solid #d5d9df;border-radius:6px;padding:4px 16px 10px;
margin:14px 0}section.session.blocked{border-left:6px solid #c62828}
details{margin:4px 0}summary{cursor:pointer}.muted{color:#66707c}.note{color:#66707c;
font-size:12px}
dl{display:grid;grid-template-columns:max-content auto;gap:0 12px;margin:6px 0}
dt{color:#66707c}dd{margin:0;overflow-wrap:anywhere}
"""


def esc(value: Any, limit: int = TEXT) -> str:
    """A value from a log as HTML text: cut to `limit` characters, each control character
    shown as the CLI shows it (`\\x1b`, `\\u202e`), then HTML-escaped (quotes too)."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else str(value)
    cut = len(text) > limit
    shown = html.escape(printable(text[:limit]), quote=True)
    return shown + "…" if cut else shown


def number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "-"


def status_badge(status: str) -> str:
    name = status if status in STATUS_RANK else "unreadable"
    return f'<span class="status st-{name}">{esc(status)}</span>'


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "",
          numeric: Sequence[int] = ()) -> str:
    """A table of cells already made HTML (escape each value with `esc` first)."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
                         for i, c in enumerate(row)) + "</tr>"
        for row in rows)
    klass = f' class="{cls}"' if cls else ""
    return f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def order_key(entry: dict[str, Any]) -> tuple[int, float, str]:
    """Blocked first, then damaged, then the rest; most recent activity first in each."""
    at = entry.get("last_record_at")
    recent = -at if isinstance(at, (int, float)) else float("inf")
    return STATUS_RANK.get(entry["status"], 3), recent, entry["path"]


def sessions_table(entries: list[dict[str, Any]], anchors: dict[str, str], now: float,
                   label: Any) -> str:
    """One row per session, in report order; a session shown in full links to its section."""
    rows = []
    for entry in entries:
        anchor = anchors.get(entry["path"])
        name = esc(label(entry["path"]), PATH)
        at = entry.get("last_record_at")
        rows.append((
            status_badge(entry["status"]),
            f'<a href="#{anchor}">{name}</a>' if anchor else name,
            esc(duration(None if at is None else max(0.0, now - at))),
            number(entry.get("records")), number(len(entry.get("blockers") or ())),
            number(entry.get("problem_count")), esc(entry.get("detail"), LONG)))
    return table(("Status", "Session", "Age", "Records", "Blockers", "Problems", "Detail"),
                 rows, "sessions", numeric=(3, 4, 5))


def page(title: str, summary: Sequence[str], sessions: str, details: Sequence[str],
         bounds: str) -> str:
    """The whole document: a head with the policy and the style sheet, then the sessions."""
    generated = clock(time.time())
    lines = "".join(f"<p>{line}</p>" for line in summary)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>walj report: {title}</title><style>{STYLE}</style></head><body>"
            f"<header><h1>walj report: {title}</h1>{lines}"
            f"<p>generated {generated} UTC</p></header><main>"
            f'<h2>Sessions</h2><p class="note">{bounds}</p>{sessions}'
            + "".join(details) + "</main></body></html>\n")
