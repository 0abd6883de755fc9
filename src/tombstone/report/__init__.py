"""Reports across receipts (``tombstone report``) and the local read-only viewer (``tombstone serve``).

:mod:`collect` reads receipts and judges them (signatures only against a key the reader names, the chain,
per-subject outcomes), :mod:`explain` says in plain words what each status shows and does not, :mod:`render`
writes the report as self-contained HTML, Markdown or JSON, :mod:`readonly` opens a lineage db so that nothing
can be written to it, and :mod:`server` is the viewer.
"""

from tombstone.report.collect import Report, build_report, read_deployment, read_files
from tombstone.report.render import FORMATS, render

__all__ = ["FORMATS", "Report", "build_report", "read_deployment", "read_files", "render"]
