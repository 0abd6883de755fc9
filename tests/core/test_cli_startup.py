"""What a command costs before it does anything: the CLI imports nothing heavy to print its help or version,
and lists only the adapters a user can use. (Start-up time itself is measured in benchmarks/startup.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test_cli import run

HEAVY = ("numpy", "scipy", "jsonschema", "sqlite3", "cryptography", "tombstone.api", "tombstone.lineage")


def test_help_and_version_import_nothing_heavy():
    code = (
        "import sys; from tombstone.cli import main\n"
        "for args in (['--version'], ['--help'], ['erase', '--help'], ['audit', '--help']):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in {HEAVY!r}))\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout, result.stdout


def test_the_public_names_still_import_on_use():
    import tombstone

    assert tombstone.Tombstone.__name__ == "Tombstone" and callable(tombstone.init_deployment)
    assert {"Tombstone", "Receipt", "decide", "__version__"} <= set(dir(tombstone))
    try:
        tombstone.NoSuchName  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError("an unknown name was found")


def test_the_test_adapters_are_listed_only_on_request():
    listed = run("backends")
    assert listed.exit_code == 0 and "docstore" in listed.output
    assert "faulty" not in listed.output
    everything = run("backends", "--all")
    assert everything.exit_code == 0 and "faulty" in everything.output


@pytest.mark.slow
def test_loading_the_model_keeps_its_progress_bars_off_the_terminal():
    pytest.importorskip("sentence_transformers")
    code = ("from tombstone.capture import MiniLMEmbedder\n"
            "from transformers.utils import logging\n"
            "MiniLMEmbedder().embed(['a few words'])\n"
            "print('bars', logging.is_progress_bar_enabled())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stderr
    assert "Loading" not in result.stderr and "it/s" not in result.stderr, result.stderr
    assert "bars True" in result.stdout  # the library's own setting is put back for the app
