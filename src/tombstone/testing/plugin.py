"""A pytest plugin so an application's own test suite can gate on Tombstone's check.

In your ``conftest.py``::

    pytest_plugins = ["tombstone.testing.plugin"]

and in a test::

    def test_erasure_reaches_the_bytes(tombstone_check):
        result = tombstone_check("chroma", config="tombstone.toml")
        assert result.passed, result.junit()
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tombstone.check import CheckResult, run_check


@pytest.fixture
def tombstone_check(tmp_path) -> Callable[..., CheckResult]:
    """``tombstone_check(backend, config=None, canaries=3) -> CheckResult`` (scratch files under tmp_path)."""

    def check(backend: str, config: str | None = None, canaries: int = 3) -> CheckResult:
        return run_check(backend, config_path=config, canaries=canaries, workdir=tmp_path / f"check-{backend}")

    return check
