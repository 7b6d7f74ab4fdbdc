"""One session of `walj report` in full, as HTML: its state, its blocked calls with the command
that settles each, its last turns as a timeline of calls, who resolved what, and the
verification of its segments and seal chain."""

from __future__ import annotations

from typing import Any

from ._common import clock, duration, plural
from ._report_detail import BLOCKERS, ITEMS_PER_TURN, RESOLUTIONS, SEGMENTS, TURNS
from ._report_html import LONG, PATH, esc, number, status_badge, table

_FINE = frozenset({"ok", "succeeded", "resolved succeeded", "completed", "resolved", "approved",
                   "consumed", "awaiting_approval"})
_BAD = frozenset({"ambiguous", "started", "blocked", "refused", "error", "cancelled", "denied",
                  "approval_expired", "incomplete", "expired"})


def section(anchor: str, entry: dict[str, Any], detail: dict[str, Any], label: str,
            now: float) -> str:
    """The section of one session, `anchor` its id in the page."""
    status = entry["status"]
    klass = "session blocked" if status == "blocked" else "session"
    head = (f'<section class="{klass}" id="{anchor}" data-status="{esc(status)}">'
            f"<h2>{status_badge(status)} <span class=\"mono\">{esc(label, PATH)}</span></h2>")
    if "error" in detail:
        return (head + f"<p>cannot be read: {esc(detail['error'], LONG)}</p>"
                + _facts(entry, None, now) + "</section>")
    parts = [head, _facts(entry, detail, now)]
    if detail["journal"] is not None:
        parts.append(f"<p><strong>Journal:</strong> {esc(detail['journal'], LONG)}</p>")
    parts += [_blockers(detail), _approvals(detail), _timeline(detail), _resolutions(detail),
              _verification(detail), "</section>"]
    return "".join(parts)


def _facts(entry: dict[str, Any], detail: dict[str, Any] | None, now: float) -> str:
    at = entry.get("last_record_at")
    facts = [("state", esc(entry.get("detail"), LONG) if entry.get("detail") else "-"),
             ("last activity", f"{esc(clock(at))} UTC ({esc(duration(_age(at, now)))} ago)")]
    if detail is not None:
        facts += [("log id", f'<span class="mono">{esc(detail["log_id"])}</span>'),
                  ("read from", esc(detail["source"], LONG)),
                  ("records", f"{number(detail['records'])} (last seq "
                              f"{number(detail['last_seq'])})")]
    rows = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
    return f"<dl>{rows}</dl>"


def _age(at: Any, now: float) -> float | None:
    return max(0.0, now - at) if isinstance(at, (int, float)) else None


def _blockers(detail: dict[str, Any]) -> str:
    blockers = detail["blockers"]
    if not blockers:
        return ""
    parts = [f"<h3>Blocked calls ({number(detail['blocker_count'])})</h3>",
             '<p class="note">Every dispatch of this session is refused until each is resolved '
             "on the record, once a person knows what happened (<code>walj resolve --help</code>"
             " says what each outcome does to the next dispatch of the call):</p>"]
    for b in blockers:
        if b["tool"] is not None:
            what = (f"<strong>{esc(b['tool'])}</strong> {_state(b)} call "
                    f"<code>{esc(b['call_id'])}</code>, execution "
                    f"<code>{esc(b['execution_id'])}</code>, turn {esc(b['turn_sequence'])}")
        elif b["state"] == "interrupted_turn":
            what = f"<strong>turn {esc(b['turn_sequence'])}</strong> {_state(b)}"
        else:
            what = f"<code>{esc(b['execution_id'])}</code> {_state(b)}"
        parts.append(
            f'<div class="blocker"><p>{what}, started {esc(clock(b["started_at"]))} UTC '
            f"({esc(duration(b['age_seconds']))} ago)</p>"
            + _in_flight(b, detail.get("writer"))
            + _blocker_facts(b)
            + f'<pre class="command">{esc(b["command"], 8192)}</pre></div>')
    if detail["blocker_count"] > len(blockers):
        parts.append(f'<p class="note">and {number(detail["blocker_count"] - len(blockers))} '
                     f"more (the first {BLOCKERS} are shown): <code>walj inspect</code> lists "
                     "them all</p>")
    return "".join(parts)


def _in_flight(blocker: dict[str, Any], writer: dict[str, Any] | None) -> str:
    if not blocker.get("in_flight") or writer is None:
        return ""
    return (f"<p><strong>It may be in flight, not interrupted:</strong> the process that "
            f"started it (pid {esc(writer.get('pid'))}, since {esc(writer.get('since'))}) still "
            "holds the log.</p>")


def _state(blocker: dict[str, Any]) -> str:
    return f'<span class="status o-bad">{esc(blocker["state"])}</span>'


def _blocker_facts(b: dict[str, Any]) -> str:
    facts = []
    if b.get("quarantine_file") is not None:
        facts.append(("cut bytes", f"<code>{esc(b['quarantine_file'])}</code> in quarantine/"))
        facts.append(("why", esc(b["arguments_preview"], LONG)))
    elif b.get("arguments_preview") is not None:
        facts.append(("arguments", f'<span class="mono">{esc(b["arguments_preview"], LONG)}'
                                   "</span>"))
    if b.get("arguments_sha256"):
        facts.append(("fingerprint", f"<code>sha256:{esc(b['arguments_sha256'])}</code>"))
    if b.get("idempotency_key"):
        facts.append(("idem. key", f"<code>{esc(b['idempotency_key'])}</code>"))
    if b.get("error_type"):
        facts.append(("interrupted by", esc(b["error_type"])))
    if not facts:
        return ""
    return "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"


def _approvals(detail: dict[str, Any]) -> str:
    """Approval requests: the pending ones (a call waiting for a person, which blocks
    nothing) first, then the latest others, with who decided each and why."""
    rows = [(f"<code>{esc(a['approval_id'])}</code>", esc(a["tool"]),
             f"<code>{esc(a['call_id'])}</code>",
             f'<span class="mono">{esc(a["arguments_preview"], LONG)}</span>',
             esc(clock(a["requested_at"])), _outcome(a["status"]),
             esc(a["actor"]) + (f": {esc(a['note'], LONG)}" if a["note"] else ""),
             esc(clock(a["expires_at"])) if a["expires_at"] is not None else "-")
            for a in detail["approvals"]]
    if not rows:
        return ""
    count, pending = detail["approval_count"], detail["pending_approvals"]
    title = (f"{number(count)}, {number(pending)} pending" + (
        f"; the {len(rows)} shown: pending first, then the latest" if count > len(rows) else ""))
    return (f"<h3>Approvals ({title})</h3>"
            + table(("Approval", "Tool", "Call", "Arguments", "Requested (UTC)", "Status",
                     "Decided by", "Expires (UTC)"), rows, "approvals"))


def _outcome(text: Any) -> str:
    klass = "o-ok" if text in _FINE else "o-bad" if text in _BAD else "o-warn"
    return f'<span class="{klass}">{esc(text)}</span>'


def _timeline(detail: dict[str, Any]) -> str:
    turns = detail["turns"]
    if not turns:
        return "<h3>Timeline</h3><p class=\"muted\">no turns</p>" if detail["journal"] is None \
            else ""
    shown = (f"the last {len(turns)} of {number(detail['turn_count'])}"
             if detail["turn_count"] > len(turns) else plural(len(turns), "turn"))
    parts = [f"<h3>Timeline ({shown})</h3>"]
    for turn in turns:
        number_ = turn["turn_sequence"]
        name = f"turn {esc(number_)}" if number_ is not None else "outside turns"
        marks = " <span class=\"status o-bad\">interrupted turn: blocks</span>" \
            if turn["blocker"] else ""
        res = turn["resolution"]
        settled = (f" · resolved by {esc(res['actor'])}: {esc(res['note'], LONG)}"
                   if res else "")
        summary = (f"<strong>{name}</strong> {_outcome(turn['state'])} · "
                   f"{esc(clock(turn['started_at']))} UTC · "
                   f"{esc(duration(turn['duration_seconds']))} · "
                   f"{plural(turn['item_count'], 'call')}{marks}{settled}")
        rows = [_item_row(item) for item in turn["items"]]
        more = (f'<p class="note">and {number(turn["item_count"] - len(rows))} more calls (the '
                f"first {ITEMS_PER_TURN} are shown): <code>walj timeline</code></p>"
                if turn["item_count"] > len(rows) else "")
        body = table(("Seq", "Tool", "Call", "Outcome", "Duration", "Arguments",
                      "Output, error or resolution"),
                     rows, "calls", numeric=(0,)) if rows else ""
        parts.append(f"<details open><summary>{summary}</summary>{body}{more}</details>")
    if detail["turn_count"] > len(turns):
        parts.append(f'<p class="note">Only the last {TURNS} turns are shown: '
                     "<code>walj timeline</code> draws them all.</p>")
    return "".join(parts)


def _item_row(item: dict[str, Any]) -> tuple[str, ...]:
    kind = item["type"]
    if kind == "llm_calls":
        outcome = "pending" if item["pending"] else item["outcome"]
        return (number(item["seq"]), f"LLM {esc(item['model'])}", "-", _outcome(outcome),
                esc(duration(item["duration_seconds"])), "-", "")
    if kind == "approval":
        return (number(item["seq"]), esc(item["tool"]), f"<code>{esc(item['call_id'])}</code>",
                _outcome("awaiting_approval"), "-",
                f'<span class="mono">{esc(item["arguments_preview"], LONG)}</span>',
                f"asked for approval <code>{esc(item['approval_id'])}</code> (now "
                f"{esc(item['status'])}); nothing ran")
    if kind == "executions":
        res = item["resolution"]
        marks = " ".join(m for m, on in (("AMBIGUOUS", item["ambiguous"]),
                                         ("BLOCKER", item["blocker"])) if on)
        if res is not None:
            said = f"resolved by {esc(res['actor'])}: {esc(res['note'], LONG)}"
        elif item["error"]:
            said = esc(item["error"], LONG)
        elif item["error_type"]:
            said = f"interrupted by {esc(item['error_type'])}"
        elif item.get("output_preview") is not None:
            said = f'<span class="mono">{esc(item["output_preview"], LONG)}</span>'
        else:
            said = ""
        return (number(item["seq"]), esc(item["tool"]), f"<code>{esc(item['call_id'])}</code>",
                _outcome(item["outcome"]) + (f" <strong>{marks}</strong>" if marks else ""),
                esc(duration(item["duration_seconds"])),
                f'<span class="mono">{esc(item.get("arguments_preview"), LONG)}</span>', said)
    said = {"blocked": "the journal was blocked; nothing ran",
            "replayed": f"answered from record {esc(item.get('answered_from_seq'))}; nothing ran",
            "refused": f"{esc(item.get('refused_reason'), LONG)}; nothing ran"}[kind]
    mark = "REPLAYED" if kind == "replayed" else ""
    return (number(item["seq"]), esc(item["tool"]), f"<code>{esc(item['call_id'])}</code>",
            _outcome(item["outcome"]) + (f" <strong>{mark}</strong>" if mark else ""), "-", "-",
            said)


def _resolutions(detail: dict[str, Any]) -> str:
    resolved = detail["resolutions"]
    if not resolved:
        return ""
    rows = [(esc(r["kind"]), f"<code>{esc(r['execution_id'])}</code>"
             if r["execution_id"] else f"turn {esc(r['turn_sequence'])}",
             esc(r["tool"]), _outcome(r["outcome"]), esc(r["actor"]), esc(clock(r["at"])),
             esc(r["note"], LONG)) for r in resolved]
    count = detail["resolution_count"]
    title = (f"the last {RESOLUTIONS} of {number(count)}" if count > len(rows)
             else number(count))
    return (f"<h3>Who resolved what ({title})</h3>"
            + table(("Kind", "Resolved", "Tool", "Outcome", "Actor", "At (UTC)", "Note"), rows))


def _verification(detail: dict[str, Any]) -> str:
    v = detail["verification"]
    count = v["segment_count"]
    chain = ('<span class="o-ok">verified</span>: each seal matches the SHA-256 of its '
             "segment, and each segment's header names the seal before it"
             if v["chain_ok"] else
             '<span class="o-bad">BROKEN</span>: ' + ", ".join(esc(k) for k in
                                                             v["chain_problems"]))
    if v["base"] is not None:
        chain += (f" (a compacted log: from segment {number(v['base']['segment'])}, seq "
                  f"{number(v['base']['first_seq'])}, its base marker)")
    parts = [f"<h3>Verification ({plural(count, 'segment')}, "
             f"{number(v['ok_count'])} without a problem)</h3>",
             f"<p>Seal chain: {chain}."
             + (f" Head: <code>{esc(v['chain_head'])}</code>." if v["chain_head"] else "")
             + "</p>"]
    rows = []
    for seg in v["segments"]:
        if seg["problems"]:
            verdict = '<span class="o-bad">' + esc(", ".join(seg["problems"]), LONG) + "</span>"
        elif seg["sealed"]:
            verdict = '<span class="o-ok">ok, sealed</span>'
        else:
            verdict = '<span class="o-ok">ok, open</span> (the last: still written to)' \
                if seg["last"] else "ok"
        rows.append((esc(seg["name"]), number(seg["first_seq"]), number(seg["last_seq"]),
                     number(seg["records"]), verdict,
                     f"<code>{esc(seg['sha256'])}</code>" if seg["sha256"] else "-"))
    parts.append(table(("Segment", "First seq", "Last seq", "Records", "Verdict", "Seal SHA-256"),
                       rows, "segments", numeric=(1, 2, 3)))
    if count > len(rows):
        parts.append(f'<p class="note">{number(count - len(rows))} other segments, each '
                     f"verified (rows are shown for up to {SEGMENTS} with a problem and the "
                     f"last {SEGMENTS}).</p>")
    parts += _problems(detail, v)
    return "".join(parts)


def _problems(detail: dict[str, Any], v: dict[str, Any]) -> list[str]:
    parts = []
    torn = detail["torn_tail"]
    if torn is not None:
        parts.append(f"<p>Torn tail: {number(torn['length'])} bytes at byte "
                     f"{number(torn['offset'])} of {esc(torn['file'])} ({esc(torn['kind'])}): "
                     "a write in progress or a crash mid-append, not damage.</p>")
    if v["other_problems"]:
        parts.append("<p>Other problems: " + esc(", ".join(v["other_problems"]), LONG) + "</p>")
    problems = detail["problems"]
    if problems:
        rows = [(esc(p["file"]), number(p["offset"]), number(p["seq"]), esc(p["kind"]),
                 esc(p["detail"], LONG)) for p in problems]
        parts.append(f"<h3>Problems ({number(detail['problem_count'])})</h3>"
                     + table(("File", "Offset", "Seq", "Kind", "Detail"), rows,
                             numeric=(1, 2)))
    return parts
