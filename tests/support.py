"""Helpers the test modules share (imported by name: ``from support import ...``); fixtures are in conftest.py."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

from tombstone import Tombstone
from tombstone.capture import HashingEmbedder


class FrozenClock:
    """A clock that moves only when told to (one microsecond per call, so times stay ordered)."""

    def __init__(self, start: datetime = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)) -> None:
        self._ticks = itertools.count()
        self.start = start

    def __call__(self) -> datetime:
        return self.start + timedelta(microseconds=next(self._ticks))


def write_docs(tomb: Tombstone, subject: str, n: int, *, prefix: str | None = None, texts=None):
    """Write ``n`` documents for ``subject`` through the wrapper; return their ids."""
    from tombstone_adapters.docstore import DocStore

    prefix = prefix or f"{subject}-doc"
    store = DocStore(tomb.config.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
    ids = [f"{prefix}-{i:04d}-{'x' * 8}" for i in range(n)]
    texts = texts or [f"text of {subject} number {i} with some words" for i in range(n)]
    try:
        store.add_many([(i, t, {"n": k}) for k, (i, t) in enumerate(zip(ids, texts))], subject=subject)
    finally:
        store.close()
    return ids


def raising_stub(obj, exc: BaseException):
    """A stand-in for a vendor client object whose every public method raises ``exc`` (for a
    conformance env's ``vendor_failure``: patch it over the client the adapter holds)."""
    from unittest import mock

    stub = mock.NonCallableMock(spec=obj)
    for name in dir(type(obj)):
        if not name.startswith("_") and callable(getattr(type(obj), name, None)):
            getattr(stub, name).side_effect = exc
    return stub


class BrokenFragments(HashingEmbedder):
    """Embeds chunks, fails on fragments (eight words at most): the write lands, its probe capture does not."""

    def embed(self, texts):
        if texts and len(texts[0].split()) <= 8:
            raise RuntimeError("model server went away")
        return super().embed(texts)

    __call__ = embed


def run_readme_example(marker: str, folder, release=lambda: None) -> dict:
    """Run, in ``folder`` (the current directory meanwhile), the README's one Python example that holds
    ``marker``, exactly as written; ``release`` runs after it whatever happens. Returns its namespace."""
    import os
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    [example] = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if marker in b]
    namespace: dict = {}
    before = os.getcwd()
    os.chdir(folder)
    try:
        exec(compile(example, "README.md", "exec"), namespace)
    finally:
        os.chdir(before)
        release()
    return namespace
