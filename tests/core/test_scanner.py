"""The multi-pattern byte scanner against a naive reference."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tombstone.errors import PhysicalUnsupportedError, StoreUnavailableError
from tombstone.verify import scanner
from tombstone.verify.scanner import scan_files


def naive(data: bytes, pattern: bytes) -> list[int]:
    out, start = [], data.find(pattern)
    while start != -1:
        out.append(start)
        start = data.find(pattern, start + 1)
    return out


@pytest.mark.parametrize("engine", ["hyperscan", "aho-corasick"])
@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    data=st.binary(min_size=0, max_size=600),
    patterns=st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=5),
    chunk=st.integers(min_value=1, max_value=64),
    threads=st.integers(min_value=1, max_value=3),
    window=st.integers(min_value=1, max_value=7),
)
def test_matches_naive_search_across_chunk_and_thread_boundaries(tmp_path, monkeypatch, engine, data, patterns,
                                                                 chunk, threads, window):
    """Binary patterns (NUL bytes included), every overlap, chunks as small as one byte, files split among
    threads, longer patterns searched by a window of their bytes and checked whole: the same offsets as a
    naive search, with either matcher."""
    if engine == "aho-corasick":
        monkeypatch.setitem(__import__("sys").modules, "hyperscan", None)  # as where no wheel installs
    monkeypatch.setattr(scanner, "WINDOW", window)
    monkeypatch.setattr(scanner, "CHUNK_SIZE", chunk)
    monkeypatch.setattr(scanner, "SEGMENT_MIN", 1)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    keyed = {f"p{i}": p for i, p in enumerate(patterns)}
    assert scanner._Matcher([b"x"]).engine == engine
    report = scan_files([path], keyed, threads=threads)
    for key, pattern in keyed.items():
        assert [h.offset for h in report.found(key)] == naive(data, pattern), key
    assert report.bytes_scanned == len(data)



def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("engine", ["hyperscan", "aho-corasick"])
@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    streams=st.lists(st.tuples(st.binary(min_size=0, max_size=400), st.lists(st.integers(0, 400), max_size=12)),
                     min_size=1, max_size=3),
    patterns=st.lists(st.binary(min_size=1, max_size=9), min_size=1, max_size=5),
    empties=st.booleans(),
    window=st.integers(min_value=1, max_value=7),
)
def test_streams_match_naive_search_whatever_their_parts(monkeypatch, engine, streams, patterns, empties, window):
    """A stream's bytes in parts of any size (one byte, empty, shorter than a pattern, a match across three
    parts): every match found once, at its offset in the stream, as a naive search of the whole finds it."""
    if engine == "aho-corasick":
        monkeypatch.setitem(__import__("sys").modules, "hyperscan", None)
    monkeypatch.setattr(scanner, "WINDOW", window)
    keyed = {f"p{i}": p for i, p in enumerate(patterns)}
    given_streams = []
    for n, (data, cuts) in enumerate(streams):
        parts = _split(data, cuts)
        if empties:
            parts = [b""] + [x for part in parts for x in (part, b"")]
        given_streams.append(scanner.Stream(f"s{n}", iter(parts)))
    report = scanner.scan_streams(given_streams, keyed)
    assert report.files == [f"s{n}" for n in range(len(streams))]
    assert report.bytes_scanned == sum(len(data) for data, _ in streams)
    for key, pattern in keyed.items():
        want = [(f"s{n}", at) for n, (data, _) in enumerate(streams) for at in naive(data, pattern)]
        assert [(h.file, h.offset) for h in report.found(key)] == want, key


def test_a_stream_that_fails_midway_raises_rather_than_reporting_absence():
    """A part that cannot be read (the server went away) ends the scan with the error: the bytes after it were
    never seen, so nothing may be reported clean."""
    def parts():
        yield b"abc" * 10
        raise StoreUnavailableError("the server closed the connection")

    with pytest.raises(StoreUnavailableError, match="closed the connection"):
        scanner.scan_streams([scanner.Stream("s", parts())], {"p": b"zzz"})
    found = scanner.scan_streams([scanner.Stream("s", iter([b"abcz", b"zzab"]))], {"p": b"zzz"})  # the control
    assert [(h.file, h.offset) for h in found.found("p")] == [("s", 3)]



def test_a_stream_that_goes_on_past_the_bound_raises_rather_than_reading_forever(monkeypatch):
    """A stream has the file scanner's bound: one that never ends (a relation file growing while it is read, a
    server that keeps sending) stops at it, unreported as clean, and what was under the bound is not enough."""
    import itertools

    monkeypatch.setattr(scanner, "MAX_FILE_BYTES", 100)
    endless = (b"x" * 30 for _ in itertools.count())
    with pytest.raises(PhysicalUnsupportedError, match="past the scan bound"):
        scanner.scan_streams([scanner.Stream("grows", endless)], {"p": b"zzz"})
    # the control: a stream of exactly the bound is read whole, its match at the very end found
    whole = scanner.scan_streams([scanner.Stream("s", iter([b"x" * 50, b"x" * 47 + b"zzz"]))], {"p": b"zzz"})
    assert whole.bytes_scanned == 100 and [h.offset for h in whole.found("p")] == [97]

def test_a_sparse_fingerprint_is_searched_by_its_nonzero_bytes_not_by_zeros(tmp_path):
    """A fingerprint of a sparse embedding is mostly zeros, and a reclaim in place leaves zeros where the
    erased vectors lay. Its searched window holds its nonzero bytes (nearest the middle), so the zeroed
    region gives the matcher nothing to check; the copy is still found, once, and only where it is."""
    import numpy as np

    vector = np.zeros(32, dtype="<f4")
    vector[[1, 3, 29, 30]] = [0.25, -0.5, 0.125, 0.75]  # the middle 64 bytes are all zeros
    pattern = vector.tobytes()
    at = scanner._window_at(pattern)
    assert any(pattern[at : at + scanner.WINDOW]), "the window searched is not all zeros"
    assert scanner._window_at(bytes(range(1, 101))) == (100 - scanner.WINDOW) // 2  # no zeros: the middle
    assert scanner._window_at(b"short") == 0
    path = tmp_path / "index.bin"
    path.write_bytes(bytes(1 << 20) + pattern + bytes(4096) + pattern[:-1] + b"\x01")
    report = scan_files([path], {"content": pattern})
    assert [h.offset for h in report.found("content")] == [1 << 20]
    matcher = scanner._Matcher([pattern])
    if matcher.engine == "hyperscan":
        calls = []
        real = matcher._windows
        matcher._windows = [_Counting(entry, calls) for entry in real]
        assert matcher.find(memoryview(bytes(1 << 16)), matcher.scratch()) == []
        assert calls == [], "a run of zeros gave the matcher windows to check"


class _Counting(list):
    def __init__(self, entries, calls):
        super().__init__(entries)
        self.calls = calls

    def __iter__(self):
        self.calls.append(1)
        return super().__iter__()


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


def _bounded(action, seconds: float = 20.0):
    """Run ``action`` in a thread; fail (instead of hanging the suite) if it has not returned in time."""
    import threading

    out: dict = {}

    def target():
        try:
            out["value"] = action()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the scan did not return within {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_a_fifo_is_refused_not_read(tmp_path):
    import os

    store = tmp_path / "store"
    store.mkdir()
    (store / "docstore.db").write_bytes(b"clean")
    fifo = store / "docstore.db-shm"
    os.mkfifo(fifo)
    with pytest.raises(PhysicalUnsupportedError, match="docstore.db-shm is a FIFO"):
        _bounded(lambda: scan_files([store / "docstore.db", fifo], {"x": b"id-1"}, root=store))


def test_a_link_to_dev_zero_is_refused_not_read(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "docstore.db").write_bytes(b"clean")
    link = store / "docstore.db-journal"
    link.symlink_to("/dev/zero")
    with pytest.raises(PhysicalUnsupportedError, match="docstore.db-journal is a symbolic link that leaves the store"):
        _bounded(lambda: scan_files([store / "docstore.db", link], {"x": b"id-1"}, root=store))
    with pytest.raises(PhysicalUnsupportedError, match="symbolic link"):  # without a root, no link is followed
        _bounded(lambda: scan_files([link], {"x": b"id-1"}))


def test_a_path_through_a_linked_folder_that_leaves_the_store_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data_level0.bin").write_bytes(b"someone else's id-1")
    store = tmp_path / "store"
    store.mkdir()
    (store / "segment").symlink_to(outside, target_is_directory=True)
    with pytest.raises(PhysicalUnsupportedError, match="resolves outside the store"):
        _bounded(lambda: scan_files([store / "segment" / "data_level0.bin"], {"x": b"id-1"}, root=store))


def test_a_link_inside_the_store_is_scanned_as_its_target(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "real.bin").write_bytes(b"..id-1..")
    (store / "alias.bin").symlink_to(store / "real.bin")
    report = _bounded(lambda: scan_files([store / "alias.bin"], {"x": b"id-1"}, root=store))
    assert [(h.file, h.offset) for h in report.found("x")] == [(str(store / "alias.bin"), 2)]


def test_no_file_is_read_past_its_size_when_opened(tmp_path, monkeypatch):
    monkeypatch.setattr(scanner, "MAX_FILE_BYTES", 4)
    big = tmp_path / "big.bin"
    big.write_bytes(b"0123456789")
    with pytest.raises(PhysicalUnsupportedError, match="larger than the scan bound"):
        scan_files([big], {"x": b"9"}, root=tmp_path)


def test_every_byte_value_is_written_as_its_own_hex_escape_for_the_matcher(tmp_path):
    """The matcher's expressions name each byte of a pattern as ``\\xHH``, all 256 values included; a scan
    finds patterns holding every byte value (NUL, newline, backslash, regex metacharacters) where they lie and
    not a near miss."""
    from tombstone.verify.scanner import _escaped

    every = bytes(range(256))
    assert _escaped(every) == b"".join(b"\\x%02x" % c for c in every)
    assert _escaped(b"") == b""
    pieces = {f"p{k}": every[k:k + 24] for k in range(0, 232, 8)}
    near = {f"miss{k}": every[k:k + 23] + b"!" for k in range(0, 232, 40)}
    path = tmp_path / "bytes.bin"
    path.write_bytes(b"head" + every + b"tail")
    report = scan_files([path], {**pieces, **near})
    assert all([h.offset for h in report.hits[key]] == [4 + int(key[1:])] for key in pieces)
    assert not any(report.hits[key] for key in near)


def test_the_same_patterns_again_reuse_the_matcher_and_others_get_their_own(tmp_path, monkeypatch):
    """A reclaim's scan and the physical probe after it ask for the same patterns: one compile between them.
    Other patterns (one more, or the same in another order) are compiled for themselves, and each scan finds
    what it was asked for."""
    built = []
    real = scanner._Matcher

    def counting(patterns):
        built.append(list(patterns))
        return real(patterns)

    monkeypatch.setattr(scanner, "_Matcher", counting)
    scanner.forget()  # what earlier scans of this process kept
    path = tmp_path / "f.bin"
    path.write_bytes(b"..alpha..beta..gamma..")
    first = {"a": b"alpha", "b": b"beta"}
    assert [len(scan_files([path], first).found(k)) for k in first] == [1, 1]
    assert [len(scan_files([path], dict(first)).found(k)) for k in first] == [1, 1]
    assert len(built) == 1
    more = {**first, "g": b"gamma"}
    assert [h.offset for h in scan_files([path], more).found("g")] == [15]
    swapped = {"b": b"beta", "a": b"alpha"}
    assert [h.offset for h in scan_files([path], swapped).found("a")] == [2]
    assert len(built) == 3
    # a batch's stores each keep theirs: the first patterns are still kept after the others were built, up to
    # scanner.KEEP matchers, the least recently used going first
    assert len(scan_files([path], first).found("a")) == 1 and len(built) == 3
    for n in range(scanner.KEEP):
        scan_files([path], {"x": b"x%d" % n})
    assert scanner.kept() == scanner.KEEP and len(built) == 3 + scanner.KEEP
    assert len(scan_files([path], first).found("a")) == 1 and len(built) == 4 + scanner.KEEP
    scanner.forget()
    assert scanner.kept() == 0


def test_a_prepared_matcher_is_built_on_its_own_thread_and_used_by_the_scan(tmp_path, monkeypatch):
    """``prepare`` builds the matcher while the caller goes on; the scan of the same patterns waits for it and
    uses it (no second build). A build that failed there is done again by the scan, in the caller's thread."""
    import threading

    built = []
    real = scanner._Matcher
    release = threading.Event()

    def slow(patterns):
        built.append(threading.current_thread().name)
        if threading.current_thread().name == "tombstone-scan-prepare":
            assert release.wait(10)
        return real(patterns)

    monkeypatch.setattr(scanner, "_Matcher", slow)
    path = tmp_path / "f.bin"
    path.write_bytes(b"..alpha..beta..")
    patterns = {"a": b"alpha", "b": b"beta"}
    scanner.forget()  # what earlier scans of this process kept
    scanner.prepare(patterns)
    assert built == ["tombstone-scan-prepare"], "building, and the caller has gone on"
    release.set()
    report = scan_files([path], dict(patterns))
    assert [h.offset for h in report.found("a")] == [2] and [h.offset for h in report.found("b")] == [9]
    assert len(built) == 1

    def failing(patterns):
        built.append(threading.current_thread().name)
        if threading.current_thread().name == "tombstone-scan-prepare":
            raise RuntimeError("injected")
        return real(patterns)

    monkeypatch.setattr(scanner, "_Matcher", failing)
    built.clear()
    other = {"g": b"..beta"}
    scanner.prepare(other)
    assert [h.offset for h in scan_files([path], other).found("g")] == [7]
    assert built == ["tombstone-scan-prepare", threading.current_thread().name]


def test_patterns_are_reused_only_for_the_very_same_records_and_forgotten_after_the_verification():
    import dataclasses

    from tombstone.lineage.records import ArtifactRecord
    from tombstone.verify import physical

    class Stub:
        calls = 0

        def has(self, _capability):
            return True

        def physical_patterns(self, art):
            Stub.calls += 1
            return physical.default_patterns(art)

    adapter = Stub()
    arts = [ArtifactRecord("s", f"a{i}", "toy", "vector", fingerprint=tuple(float(i + k) for k in range(8)))
            for i in range(3)]
    first = physical._patterns(adapter, arts)
    assert physical._patterns(adapter, list(arts)) is not None and Stub.calls == 3, "the same records: reused"
    changed = [dataclasses.replace(arts[0], fingerprint=tuple(9.0 for _ in range(8))), *arts[1:]]
    second = physical._patterns(adapter, changed)
    assert Stub.calls == 6 and second[1]["content\x00a0"] != first[1]["content\x00a0"], "equal ids, other records"
    physical._patterns(Stub(), changed)
    assert Stub.calls == 9, "another adapter"
    with physical.prepared(adapter, arts):
        assert Stub.calls == 12
        physical._patterns(adapter, arts)
        assert Stub.calls == 12
    assert physical._last.patterns is None, "nothing of the artifacts is kept past their verification"
    assert scanner.kept() == 0, "nor the matcher built for their patterns"


@settings(max_examples=400, deadline=None)
@given(st.binary(min_size=0, max_size=160), st.lists(st.integers(min_value=0, max_value=159), max_size=40))
def test_the_window_searched_has_the_fewest_zeros_nearest_the_middle(data, zeroed):
    """The SIMD matcher's window of a long pattern, against the rule written out by brute force: the run of
    WINDOW bytes with the most nonzero bytes, the one nearest the middle among equals (the first of two)."""
    pattern = bytearray(data)
    for at in zeroed:
        if at < len(pattern):
            pattern[at] = 0
    pattern = bytes(pattern)
    window = scanner.WINDOW
    if len(pattern) <= window:
        assert scanner._window_at(pattern) == 0
        return
    middle = (len(pattern) - window) // 2
    starts = range(len(pattern) - window + 1)
    most = max(sum(1 for b in pattern[s : s + window] if b) for s in starts)
    best = [s for s in starts if sum(1 for b in pattern[s : s + window] if b) == most]
    assert scanner._window_at(pattern) == min(best, key=lambda s: (abs(s - middle), s))
