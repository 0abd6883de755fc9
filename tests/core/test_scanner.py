"""The multi-pattern byte scanner against a naive reference."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tombstone.errors import StoreUnavailableError
from tombstone.verify import scanner
from tombstone.verify.scanner import scan_files


def naive(data: bytes, pattern: bytes) -> list[int]:
    out, start = [], data.find(pattern)
    while start != -1:
        out.append(start)
        start = data.find(pattern, start + 1)
    return out


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    data=st.binary(min_size=0, max_size=600),
    patterns=st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=5),
    chunk=st.integers(min_value=1, max_value=64),
)
def test_matches_naive_search_across_chunk_boundaries(tmp_path, monkeypatch, data, patterns, chunk):
    monkeypatch.setattr(scanner, "CHUNK_SIZE", chunk)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    keyed = {f"p{i}": p for i, p in enumerate(patterns)}
    report = scan_files([path], keyed)
    for key, pattern in keyed.items():
        assert [h.offset for h in report.found(key)] == naive(data, pattern), key
    assert report.bytes_scanned == len(data)


def test_each_file_is_read_once_for_all_patterns(tmp_path, monkeypatch):
    opened = []
    real_open = open

    def counting_open(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"xxidAyyidB")
    b.write_bytes(b"idB")
    report = scan_files([a, b, tmp_path / "missing"], {"A": b"idA", "B": b"idB", "C": b"idC"})
    assert opened == [str(a), str(b)]
    assert [h.file for h in report.found("B")] == [str(a), str(b)]
    assert report.found("C") == []
    assert report.files == [str(a), str(b)]


def test_unreadable_file_raises_rather_than_reporting_absence(tmp_path):
    directory = tmp_path / "not-a-file"
    directory.mkdir()
    with pytest.raises(StoreUnavailableError):
        scan_files([directory], {"x": b"x"})


def test_empty_pattern_rejected(tmp_path):
    with pytest.raises(ValueError):
        scan_files([], {"x": b""})
