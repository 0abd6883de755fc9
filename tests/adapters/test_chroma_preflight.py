"""Chroma's preflight reads the collection from chroma.sqlite3 itself: no private copy of the persist
directory per erasure, no byte of the store changed, one line for a collection that is not there."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import pytest

from tombstone.config import load_config
from tombstone.contract import adapter_class
from tombstone.errors import StoreUnavailableError



def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def chroma_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pf") / "d"
    from click.testing import CliRunner

    from tombstone.cli import main

    result = CliRunner().invoke(main, ["demo", "--workdir", str(root), "--backends", "chroma,docstore", "--subjects", "3",
                                       "--erase", "none"])
    assert result.exit_code == 0, result.output
    cfg = load_config(root / "tombstone.toml").stores["chroma"]
    return root, dict(cfg.options)


def test_preflight_copies_nothing_and_changes_nothing(chroma_store, tmp_path, monkeypatch):
    root, options = chroma_store
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    before = _hashes(root / "stores")
    cls = adapter_class("chroma")
    assert cls.preflight("chroma", options) is True
    assert list(scratch.iterdir()) == [], "the preflight made a copy of the store"
    assert _hashes(root / "stores") == before
    # the control: the read-only open the default preflight would use copies the persist directory
    adapter = cls.open_read_only("chroma", options)
    try:
        assert any(p.name.startswith("tombstone-chroma-") for p in scratch.iterdir())
    finally:
        adapter.close()


def test_a_collection_that_is_not_there_is_one_line(chroma_store):
    root, options = chroma_store
    with pytest.raises(StoreUnavailableError, match="no collection 'nosuch'"):
        adapter_class("chroma").preflight("chroma", {**options, "collection": "nosuch"})
    with pytest.raises(StoreUnavailableError, match="no Chroma persist directory"):
        adapter_class("chroma").preflight("chroma", {**options, "path": str(root / "nowhere")})
