from __future__ import annotations

from pathlib import Path

import pytest

from tombstone import Tombstone, init_deployment
from tombstone.config import Config

from support import FrozenClock, raising_stub, write_docs


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def deployment(tmp_path: Path) -> Config:
    """A fresh deployment with one docstore store named 'docs'."""
    from tombstone_adapters.docstore import DocStore

    config = init_deployment(
        tmp_path / "deploy", {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"}}
    )
    DocStore(config.stores["docs"].options["path"]).close()  # the app creates its store
    return config


@pytest.fixture
def tomb(deployment: Config, clock: FrozenClock):
    with Tombstone(deployment, clock=clock) as t:
        yield t
