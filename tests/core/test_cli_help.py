"""Every command's --help ends with one example, and the example is a command line the command accepts."""

from __future__ import annotations

import shlex

import click

from tombstone.cli import main
from tombstone.cli.examples import EXAMPLES

from test_cli import run


def _leaves(group: click.Group, prefix: str = ""):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaves(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def test_every_command_has_an_example_its_parser_accepts():
    leaves = dict(_leaves(main))
    assert set(EXAMPLES) == set(leaves), set(EXAMPLES) ^ set(leaves)
    for path, command in leaves.items():
        _, example = EXAMPLES[path]
        words = shlex.split(example.split(" > ")[0])
        assert words[: 1 + len(path.split())] == ["tombstone", *path.split()], example
        # parse the example's arguments with the command's own parser (nothing runs)
        command.make_context(path, words[1 + len(path.split()):])
        assert "Example" in (command.epilog or "")


def test_the_example_is_printed_at_the_end_of_help():
    result = run("erase", "--help")
    assert result.exit_code == 0
    assert result.output.rstrip().endswith("$ tombstone erase user-42 --out user-42.json")
    nested = run("receipt", "verify", "--help")
    assert "$ tombstone receipt verify receipts/user-42.json --key keys/signing.pub" in nested.output


def test_a_wrong_example_would_be_caught():
    """Control: the parser refuses an option the command does not have."""
    import pytest

    command = dict(_leaves(main))["erase"]
    with pytest.raises(click.UsageError):
        command.make_context("erase", ["user-42", "--no-such-option"])
