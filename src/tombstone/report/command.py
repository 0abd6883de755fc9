"""What ``tombstone report`` does between reading its options and printing: choose the receipts and the
trusted key, build the report, write it."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from tombstone.config import load_config
from tombstone.errors import ConfigError
from tombstone.keys import PUBLIC_KEY, load_public_key
from tombstone.receipt.files import receipt_in
from tombstone.report.collect import (Report, build_report, deployment_head, read_deployment, read_files,
                                      sealed_copies_place)
from tombstone.report.render import FORMATS, render

EXIT_OK, EXIT_FAILED, EXIT_ACTION_NEEDED = 0, 1, 3


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def make_report(paths: Sequence[str], *, config_path: str | None, key_path: str | None,
                anchor: str | None = None) -> Report:
    """The report over ``paths`` (files, directories), or over the deployment's sealed copies when no path is
    given and ``config_path`` names the deployment. The trusted key is ``key_path``, else the deployment's;
    never one found next to the receipts."""
    if not paths and not config_path:
        raise ConfigError("give receipt files or directories, or --config FILE for the deployment's sealed copies")
    config = load_config(config_path) if config_path else None
    head = None
    if paths:
        sources = read_files(paths)
        names = [str(p) for p in paths]
        if config is not None:
            head = deployment_head(config)
    else:
        assert config is not None
        sources, head = read_deployment(config)
        names = [sealed_copies_place(config)]
    key = key_source = None
    if key_path:
        key, key_source = load_public_key(Path(key_path)), f"--key {key_path}"
    elif config is not None:
        key, key_source = load_public_key(config.keys_dir / PUBLIC_KEY), f"the deployment's key, {config.path}"
    return build_report(sources, key=key, key_source=key_source, source_names=names, deployment_head=head,
                        anchor=anchor)


def write_report(report: Report, fmt: str, out: str | None) -> None:
    """Print the report, or write it to ``out`` (never over a receipt)."""
    check_format(fmt)
    text = render(report, fmt)
    if out is None:
        sys.stdout.write(text)
        return
    from tombstone.fsutil import write_atomic

    target = Path(out)
    if target.is_dir():
        raise ConfigError(f"--out {out} is a directory; give a file name")
    if receipt_in(target) is not None:
        raise ConfigError(f"--out {out} holds a receipt; refusing to overwrite it")
    if not target.parent.is_dir():
        raise ConfigError(f"--out {out}: directory {target.parent} does not exist")
    try:
        write_atomic(target, text.encode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror or exc}") from exc


def exit_code(report: Report) -> int:
    """1 when any receipt read fails its check or the chain is broken, 3 when a subject needs action, else 0."""
    if report.failed:
        return EXIT_FAILED
    return EXIT_ACTION_NEEDED if report.needs_action else EXIT_OK


def summary_line(report: Report) -> str:
    signatures = f"signatures checked against {report.key}" if report.signatures_checked else "signature not checked"
    line = (f"{len(report.subjects)} subject(s), {len(report.needs_action)} needing action; {signatures};"
            f" chain: {report.chain.text}")
    if report.failures:
        named = "; ".join(f"{f.where}: {f.reason}" for f in report.failures)
        line += f"; {len(report.failures)} receipt file(s) fail their check: {named}"
    return line


__all__ = ["check_format", "exit_code", "make_report", "summary_line", "write_report"]
