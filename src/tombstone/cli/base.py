"""The command group, exit codes, one-line errors and the table layout every command shares."""

from __future__ import annotations

import sys
from typing import Any

import click

from tombstone.display import printable
from tombstone.errors import ReceiptError, TombstoneError


EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ACTION_NEEDED = 3
EXIT_UNCHECKED = 4
EXIT_INTERRUPTED = 130


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ReceiptError as exc:
            echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(EXIT_FAILED)
        except TombstoneError as exc:
            echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except KeyboardInterrupt:
            echo("interrupted; 'tombstone resume' finishes any erasure that was under way", err=True)
            sys.exit(EXIT_INTERRUPTED)


def echo(message: Any = "", err: bool = False, **kwargs: Any) -> None:
    """``click.echo`` for everything the CLI prints: control and bidirectional characters escaped, since
    subjects, ids and messages can come from anyone (:func:`tombstone.display.printable`)."""
    click.echo(printable(message) if message is not None else message, err=err, **kwargs)


def _one_line(exc: BaseException) -> str:
    """An error as one line (a server's message can span several)."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tombstone-rag", prog_name="tombstone")
def main() -> None:
    """Erase a data subject from a RAG deployment and prove, level by level, how far the erasure went."""


CONFIG_OPTION = click.option(
    "--config", "config_path", metavar="PATH", default=None,
    help="Path to tombstone.toml, a regular file of at most 1 MiB (default: $TOMBSTONE_CONFIG, then"
         " ./tombstone.toml).",
)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _wrap(line: str, width: int = 100) -> str:
    import textwrap

    indent = " " * (len(line) - len(line.lstrip()) + 2)
    return textwrap.fill(line, width=width, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False)


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


