"""A certificate of sanitization (``tombstone receipt certificate``): one printable page derived from a verified,
signed receipt, in the shape NIST SP 800-88 Rev. 1 (Appendix G) gives such a certificate.

Every field comes from the receipt (and, where one is handed in, an auditor's verified counter-signature); the
certificate adds no claim the receipt does not make. The mapping:

* person performing the sanitization: the operator, named by the key that signed the receipt (and ``--operator``);
* person validating it: the auditor whose counter-signature verified with the key the reader trusts, or none;
* media: each store (its backend) and the records of the subject in it;
* method category (SP 800-88 / IEEE 2883): a record erased inside a live store file and checked gone is *Clear*,
  never *Purge* (the store's device may keep earlier copies of its blocks, which no file-level tool reaches);
  a record the provider deleted where nothing can be checked is *Clear* as claimed, not verified; a record
  kept (an exception, a copy at a third party) or still found is *not sanitized*. No backend today destroys a
  key, so *cryptographic erase* does not appear;
* verification method and result: the levels whose probes ran and passed, and each record's status;
* post-sanitization destination: the stores stay in service;
* what no probe reaches (backups, archived logs, replicas, provider logs, copies outside the wrappers), listed.
"""

from __future__ import annotations

import html
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tombstone.errors import ConfigError

CLEAR, CLAIMED, NONE = "Clear", "Clear (claimed by the provider, not verified)", "not sanitized"


def method_of(entry: Mapping[str, Any]) -> tuple[str, str]:
    """The SP 800-88 method category of one receipt entry, and why."""
    status = entry.get("status")
    reason = entry.get("reason") or ""
    if status == "VERIFIED":
        return CLEAR, (f"erased inside live store files, overwritten where it lay, checked absent at the"
                       f" {entry.get('level')} level; not Purge: the device may keep earlier copies of its blocks")
    if status == "UNVERIFIED":
        if "managed" in reason:
            return CLAIMED, reason
        return f"{CLEAR} (not verified)", reason
    if status == "RESIDUAL":
        return NONE, f"still found: {entry.get('measurement') or entry.get('level')}"
    return NONE, reason or str(status)


def _passed_levels(entry: Mapping[str, Any]) -> list[str]:
    probes = (entry.get("evidence") or {}).get("probes") or []
    return [p["level"] for p in probes if isinstance(p, dict) and p.get("ran") and p.get("passed")]


def _stores(receipt: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for entry in receipt.get("artifacts", []):
        row = rows.setdefault(entry["store"], {"store": entry["store"], "backend": entry.get("backend"), "n": 0,
                                               "methods": {}, "statuses": {}, "levels": set(), "techniques": set()})
        row["n"] += 1
        category, why = method_of(entry)
        row["methods"].setdefault(category, []).append(why)
        label = entry["status"] + (f"({entry['level']})" if entry.get("level") else "")
        row["statuses"][label] = row["statuses"].get(label, 0) + 1
        row["levels"].update(_passed_levels(entry))
        reclaim = (entry.get("evidence") or {}).get("reclaim") or {}
        recipe = reclaim.get("evidence", reclaim) if isinstance(reclaim, dict) else {}
        if isinstance(reclaim, dict) and reclaim.get("retained"):
            row["techniques"].add("left untouched (kept by exception)")
        elif isinstance(recipe, dict) and (recipe.get("steps") or recipe.get("mechanism")):
            steps = recipe.get("steps")
            row["techniques"].add("; ".join(str(s) for s in steps) if isinstance(steps, list) and steps
                                  else str(recipe.get("mechanism")))
    return [rows[k] for k in sorted(rows)]


_CSS = """
body { font: 11pt/1.4 system-ui, sans-serif; margin: 2em; color: #111; }
h1 { font-size: 16pt; margin: 0 0 .2em; } h2 { font-size: 12pt; margin: 1.2em 0 .3em; }
table { border-collapse: collapse; width: 100%; font-size: 9.5pt; } th, td { border: 1px solid #999;
padding: .25em .4em; text-align: left; vertical-align: top; } th { background: #eee; }
.muted { color: #555; font-size: 9pt; } code { font-size: 9pt; word-break: break-all; }
@page { size: A4; margin: 14mm; } @media print { body { margin: 0; } }
"""


def render(receipt: Mapping[str, Any], *, verified: Any, trusted: str, operator: str | None = None,
           countersignature: Mapping[str, Any] | None = None, auditor: str | None = None) -> str:
    """The certificate as one self-contained HTML page (print CSS for A4). ``verified`` is the receipt's
    verification result (``tombstone.receipt.verify``), ``trusted`` where its key came from."""
    e = html.escape
    tool = receipt.get("tool") or {}
    stores = _stores(receipt)
    rows = []
    for row in stores:
        methods = "; ".join(f"{k} ({len(v)})" for k, v in sorted(row["methods"].items()))
        why = sorted({w for v in row["methods"].values() for w in v})
        statuses = ", ".join(f"{n} {k}" for k, n in sorted(row["statuses"].items()))
        rows.append(f"<tr><td>{e(row['store'])}<br><span class='muted'>{e(str(row['backend']))}</span></td>"
                    f"<td>{row['n']}</td><td>{e(methods)}<br><span class='muted'>{e(' | '.join(why))}</span></td>"
                    f"<td class='muted'>{e(' | '.join(sorted(row['techniques'])) or '-')}</td>"
                    f"<td>{e(', '.join(sorted(row['levels'])) or 'none passed')}</td><td>{e(statuses)}</td></tr>")
    outside = "".join(f"<li><b>{e(o.get('what', ''))}</b>: {e(o.get('reason', ''))}</li>"
                      for o in receipt.get("out_of_scope") or [])
    if countersignature:
        validated = (f"auditor key <code>{e(countersignature['signature']['key_id'])}</code> (checked with"
                     f" {e(auditor or '')}), audited {e(countersignature['audited_at'])}: verdict"
                     f" <b>{e(countersignature['verdict'])}</b>, {sum(a['verdict'] == 'agree' for a in countersignature['artifacts'])}"
                     f" of {len(countersignature['artifacts'])} records re-probed and agreeing")
    else:
        validated = "no independent validation attached (an auditor's <code>tombstone audit --sign-with</code> gives one)"
    summary = ", ".join(f"{n} {k}" for k, n in sorted((receipt.get("summary") or {}).items()) if n)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Certificate of sanitization: {e(str(receipt.get('subject')))}</title>
<style>{_CSS}</style></head><body>
<h1>Certificate of sanitization</h1>
<p class="muted">In the form of NIST SP 800-88 Rev. 1, Appendix G, derived from a signed Tombstone receipt. It adds
no claim the receipt does not make; the receipt, not this page, is the record.</p>
<h2>Subject and records</h2>
<table><tr><th>data subject</th><td>{e(str(receipt.get('subject')))}</td></tr>
<tr><th>erasure</th><td>saga <code>{e(str(receipt.get('saga_id')))}</code>, {e(str(receipt.get('started_at')))} to
{e(str(receipt.get('finished_at')))}; receipt #{e(str(receipt.get('sequence')))} of the operator's chain</td></tr>
<tr><th>outcome</th><td>{e(summary)}</td></tr></table>
<h2>Media and sanitization</h2>
<table><tr><th>media (store)</th><th>records</th><th>method category</th><th>technique</th>
<th>verification (levels passed)</th><th>result</th></tr>
{''.join(rows)}</table>
<p class="muted">Post-sanitization: the stores remain in service. Tool: {e(str(tool.get('name')))}
{e(str(tool.get('version')))}.</p>
<h2>Not reached (out of scope)</h2><ul>{outside}</ul>
<h2>Performed and validated by</h2>
<table><tr><th>performed by</th><td>{e(operator or 'the operator')}, signing key <code>{e(verified.key_id)}</code></td></tr>
<tr><th>validated by</th><td>{validated}</td></tr></table>
<h2>How to verify</h2>
<p>Receipt hash <code>{e(verified.receipt_hash)}</code>, its signature checked against {e(trusted)}. Anyone holding the
operator's published key checks the receipt itself: <code>tombstone receipt verify RECEIPT.json --key signing.pub</code>
(and an auditor's counter-signature with <code>--countersignature FILE --auditor auditor-signing.pub</code>).</p>
</body></html>
"""


def browser() -> str | None:
    """The installed Chromium (the distribution's), if any."""
    return next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))),
                None)


def to_pdf(page: str, out: Path, *, timeout: float = 120.0) -> Path:
    """Print the page to PDF with the installed Chromium (headless); ConfigError where there is none."""
    exe = browser()
    if exe is None:
        raise ConfigError("--pdf needs Chromium (apt-get install chromium); the HTML prints to PDF from any browser")
    with tempfile.TemporaryDirectory(prefix="tombstone-certificate-") as tmp:
        source = Path(tmp) / "certificate.html"
        source.write_text(page, encoding="utf-8")
        pdf = Path(tmp) / "certificate.pdf"
        args = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
                f"--user-data-dir={Path(tmp) / 'profile'}", f"--print-to-pdf={pdf}", source.as_uri()]
        try:
            subprocess.run(args, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ConfigError(f"Chromium did not print the certificate within {timeout:.0f} s") from exc
        if not pdf.is_file() or not pdf.read_bytes().startswith(b"%PDF"):
            raise ConfigError("Chromium did not print the certificate to PDF")
        from tombstone.fsutil import write_atomic

        write_atomic(out, pdf.read_bytes())
    return out


__all__ = ["CLAIMED", "CLEAR", "NONE", "browser", "method_of", "render", "to_pdf"]
