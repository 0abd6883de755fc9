"""A report as one self-contained HTML page (inline CSS and SVG, nothing fetched), as Markdown, or as JSON."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from tombstone.errors import ConfigError
from tombstone.report.collect import STATUS_ORDER, Report
from tombstone.verify.levels import StatusKind
from tombstone.version import __version__

FORMATS = ("html", "md", "json")

STATUS_COLOURS = {
    StatusKind.VERIFIED.value: ("#2e7d32", "#ffffff"),
    StatusKind.UNVERIFIED.value: ("#f2b632", "#1b1b1b"),
    StatusKind.RESIDUAL.value: ("#c62828", "#ffffff"),
    StatusKind.NEEDS_HUMAN.value: ("#6a1b9a", "#ffffff"),
    StatusKind.OUT_OF_SCOPE.value: ("#757575", "#ffffff"),
}
"""Fill and text colour of each status in charts and badges."""

LEVELS = (
    ("logical", "Can the store still return it?", "no query path the wrapper knows of returns the artifact",
     "that the bytes left the disk; paths that bypass the wrapper"),
    ("physical", "Are its bytes still stored?", "neither its id nor its content pattern occurs in any file the store"
     " keeps", "anything outside those files: backups, WAL archives, replicas, provider logs, freed disk blocks"),
    ("semantic", "Did the neighbourhood keep a trace?", "the hole the erasure left is the size of a normal"
     " same-cluster deletion: nothing nearby still answers as if the artifact were there",
     "presence or absence of the content; a measurement, not proof"),
    ("model", "Can the weights reproduce it?", "canary exposure, extraction and membership inference no longer tell"
     " the subject apart from people the model never saw (two nulls), while before the erasure they did",
     "that stronger attacks fail: unlearning checks are known to be fragile (arXiv:2408.00929)"),
)
"""The levels as verification-levels.md explains them, for the report's glossary."""


def require(extra: str, *modules: str) -> None:
    """Raise one ConfigError line naming the extra to install when one of ``modules`` is missing."""
    import importlib.util

    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"this needs {', '.join(missing)}: pip install 'tombstone-rag[{extra}]'")


@lru_cache(maxsize=1)
def environment() -> Any:
    """The Jinja2 environment of the report and viewer templates (package data; autoescaped)."""
    require("report", "jinja2")
    from jinja2 import Environment, PackageLoader, StrictUndefined

    env = Environment(loader=PackageLoader("tombstone.report", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.globals.update(STATUS_COLOURS=STATUS_COLOURS, LEVELS=LEVELS, STATUS_ORDER=STATUS_ORDER)
    env.filters["status_kind"] = lambda text: str(text).split("(", 1)[0]
    env.filters["meanings"] = meanings
    return env


def meanings(view: Any) -> list[tuple[str, Any]]:
    """Each distinct (status, explanation) of a receipt once, in reading order: what its table's badges mean."""
    seen: dict[tuple[str, str, str], tuple[str, Any]] = {}
    for store in view.stores:
        for group in store.groups:
            key = (group.label, group.explanation.shows, group.explanation.does_not_show)
            seen.setdefault(key, (group.label, group.explanation))
    return sorted(seen.values(), key=lambda item: STATUS_ORDER.index(str(item[0]).split("(", 1)[0]))


def status_chart(counts: dict[str, dict[str, int]]) -> Any:
    """Counts by status × store as an inline SVG of stacked horizontal bars, one per store, with a legend."""
    from markupsafe import Markup, escape

    kinds = [k for k in STATUS_ORDER if any(per.get(k) for per in counts.values())]
    if not counts or not kinds:
        return Markup('<p class="muted">No artifacts to count.</p>')
    label_w, bar_w, row_h, gap, top = 150, 470, 22, 8, 6
    biggest = max(sum(per.values()) for per in counts.values()) or 1
    legend_y = top + len(counts) * (row_h + gap) + 6
    height = legend_y + 22
    width = label_w + bar_w + 40
    parts = [f'<svg class="chart" role="img" viewBox="0 0 {width} {height}"'
             f' width="{width}" height="{height}" aria-label="Artifacts by status and store">']
    for row, (store, per) in enumerate(counts.items()):
        y = top + row * (row_h + gap)
        name = store if len(store) <= 22 else store[:21] + "\u2026"
        parts.append(f'<text x="{label_w - 8}" y="{y + row_h * 0.7:.1f}" text-anchor="end" class="chart-label">'
                     f'<title>{escape(store)}</title>{escape(name)}</text>')
        x = float(label_w)
        for kind in kinds:
            n = per.get(kind, 0)
            if not n:
                continue
            w = bar_w * n / biggest
            fill, ink = STATUS_COLOURS[kind]
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h}" fill="{fill}">'
                         f'<title>{escape(store)}: {n} {kind}</title></rect>')
            if w >= 9 * len(str(n)) + 4:
                parts.append(f'<text x="{x + w / 2:.1f}" y="{y + row_h * 0.7:.1f}" text-anchor="middle"'
                             f' fill="{ink}" class="chart-count">{n}</text>')
            x += w
        parts.append(f'<text x="{x + 4:.1f}" y="{y + row_h * 0.7:.1f}" class="chart-total">{sum(per.values())}</text>')
    x = float(label_w)
    for kind in kinds:
        fill, _ = STATUS_COLOURS[kind]
        parts.append(f'<rect x="{x:.1f}" y="{legend_y}" width="12" height="12" fill="{fill}"/>'
                     f'<text x="{x + 16:.1f}" y="{legend_y + 10}" class="chart-legend">{kind}</text>')
        x += 34 + 8 * len(kind)
    parts.append("</svg>")
    return Markup("".join(parts))


def counted_kinds(report: Report) -> list[str]:
    """The statuses that occur in the report's counts, in reading order."""
    totals = report.status_totals()
    return [kind for kind in STATUS_ORDER if totals.get(kind)]


def render_html(report: Report) -> str:
    return environment().get_template("report.html.j2").render(
        report=report, chart=status_chart(report.counts), kinds=counted_kinds(report), version=__version__)


def render_scan_html(scan: Any, *, show_ids: bool, generated_at: str) -> str:
    """A ``tombstone scan`` report as one self-contained page, in the erasure report's style."""
    return environment().get_template("scan.html.j2").render(report=scan, show_ids=show_ids,
                                                             generated_at=generated_at)


def render_json(report: Report) -> str:
    return json.dumps(report.as_json(), indent=2, ensure_ascii=False) + "\n"


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]<>|~"})


def md(text: Any) -> str:
    """Text safe inside Markdown (and a table cell): specials escaped, line breaks and controls made spaces."""
    flat = "".join(ch if ch.isprintable() else " " for ch in str(text))
    return flat.translate(_MD_SPECIAL)


def render_markdown(report: Report) -> str:
    out: list[str] = ["# Erasure report", ""]
    out.append(f"Generated {report.generated_at} from {md(', '.join(report.sources))}.")
    out.append("")
    if report.signatures_checked:
        out.append(f"Signatures checked against {md(report.key)}.")
    else:
        out.append("**Signature not checked**: no --key or --config was given, so only each receipt's hash was"
                   " compared with its content (a forger can recompute it).")
    if report.failures:
        out += ["", f"**{len(report.failures)} receipt(s) fail their check**; none of their statuses can be relied on:"]
        out += [f"- {md(f.where)} (receipt #{f.sequence}, subject {md(f.subject)}): {md(f.reason)}"
                for f in report.failures]
    out += ["", f"Chain: {md(report.chain.text)}"]
    out += [f"- {md(p)}" for p in report.chain.problems] + [f"- {md(n)}" for n in report.chain.notes]
    out += ["", "## Across subjects", ""]
    needing = report.needs_action
    out.append(f"{len(report.subjects)} subject(s); {len(needing)} still need action.")
    if needing:
        out += ["", "### Still needs action", ""]
        for s in needing:
            out.append(f"- **{md(s.subject)}**: {md(s.outcome)}")
            out += [f"  - next: {md(a)}" for a in s.actions]
    kinds = counted_kinds(report)
    if kinds:
        out += ["", "### Artifacts by status and store", "", "| store | " + " | ".join(kinds) + " |",
                "|---|" + "---:|" * len(kinds)]
        for store, per in report.counts.items():
            out.append(f"| {md(store)} | " + " | ".join(str(per.get(k, 0)) for k in kinds) + " |")
    if report.left_out:
        out += ["", f"{report.left_out} receipt(s) that fail their check are left out of these counts."]
    out += ["", "## Subjects"]
    if not report.subjects:
        out += ["", "No receipts: no erasure has finished yet."]
    for s in report.subjects:
        r = s.latest.receipt
        out += ["", f"### {md(s.subject)}", "", f"**{md(s.outcome)}**", ""]
        out.append(f"Receipt #{r.sequence} ({md(s.latest.source.where)}), saga {md(r.saga_id)}, finished"
                   f" {md(r.finished_at)}, hash `{r.receipt_hash}`: {md(s.latest.integrity.text)}.")
        if r.statement:
            out += ["", f"Statement: {md(r.statement)}"]
        if s.latest.stores:
            out += ["", "| store | status | artifacts | next step |", "|---|---|---|---|"]
            for store in s.latest.stores:
                for g in store.groups:
                    ids = ", ".join(md(i) for i in g.artifact_ids)
                    step = g.action or ("nothing: the backend's ceiling" if g.explanation.ceiling else "nothing")
                    out.append(f"| {md(store.store)} ({md(', '.join(store.backends))}) | {md(g.status)} |"
                               f" {len(g.artifact_ids)}: {ids} | {md(step)} |")
            out += [""] + [f"- {md(status)} shows: {md(e.shows)} It does not show: {md(e.does_not_show)}"
                           for status, e in meanings(s.latest)]
        out += ["", "Always out of scope:"] + [f"- {md(w)}: {md(why)}" for w, why in r.out_of_scope]
        if s.earlier:
            out += ["", "Earlier receipts:"]
            for v in s.earlier:
                totals = ", ".join(f"{k} {n}" for k, n in v.receipt.summary.items() if n) or "no artifacts"
                out.append(f"- #{v.receipt.sequence} ({md(v.source.where)}), {md(v.receipt.finished_at)}: {md(totals)};"
                           f" {md(v.integrity.text)}")
    out += ["", "## What the levels mean", "", "| level | question | a pass shows | a pass does not show |",
            "|---|---|---|---|"]
    out += [f"| {lv} | {q} | {shows} | {not_shows} |" for lv, q, shows, not_shows in LEVELS]
    out += ["", "A receipt records what was done and what was checked; it is not a legal instrument.", ""]
    return "\n".join(out)


def render(report: Report, fmt: str) -> str:
    if fmt == "html":
        return render_html(report)
    if fmt == "md":
        return render_markdown(report)
    return render_json(report)


__all__ = ["FORMATS", "LEVELS", "STATUS_COLOURS", "environment", "render", "render_html", "render_json",
           "render_markdown", "status_chart"]
