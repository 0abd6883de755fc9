"""FAISS's OpenMP thread policy: a default that does not oversubscribe a shared host, a ``threads`` option,
and ``OMP_NUM_THREADS`` honoured when the user set it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tombstone import Tombstone
from tombstone.errors import ConfigError
from tombstone_adapters.faiss import threads
from tombstone_adapters.faiss.store import FaissStore

SCRIPT = ("import sys, faiss; from tombstone_adapters.faiss.store import FaissStore;"
          " s = FaissStore(sys.argv[1], dim=8, threads=None if sys.argv[2] == '-' else sys.argv[2]);"
          " print(s.threads, faiss.omp_get_max_threads())")


def _threads_in_a_fresh_process(path, option: str, omp: str | None) -> tuple[int, int]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(path), option], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    store_says, faiss_says = done.stdout.split()
    return int(store_says), int(faiss_says)


def test_the_default_is_half_the_usable_cpus_and_never_zero(tmp_path):
    expected = max(1, len(os.sched_getaffinity(0)) // 2) if hasattr(os, "sched_getaffinity") \
        else max(1, (os.cpu_count() or 1) // 2)
    assert threads.default_threads() == expected
    assert _threads_in_a_fresh_process(tmp_path / "a", "-", None) == (expected, expected)


def test_omp_num_threads_set_by_the_user_is_left_as_it_is(tmp_path):
    # the control: the same store without the variable gets the default, with it the user's number
    assert _threads_in_a_fresh_process(tmp_path / "b", "-", "3") == (3, 3)
    assert threads.resolve(None, {"OMP_NUM_THREADS": "3"}) is None
    assert threads.resolve(None, {}) == threads.default_threads()


def test_the_option_wins_over_the_environment(tmp_path):
    assert _threads_in_a_fresh_process(tmp_path / "c", "2", "5") == (2, 2)
    assert _threads_in_a_fresh_process(tmp_path / "d", "all", "1") == (os.cpu_count(),) * 2


@pytest.mark.parametrize("bad", ["lots", "0", -1, 0, 1.5, True, ""])
def test_a_bad_threads_option_is_one_config_error(tmp_path, bad):
    with pytest.raises(ConfigError, match="threads must be a whole number of at least 1"):
        FaissStore(tmp_path / "e", dim=8, threads=bad)


def test_the_deployment_option_reaches_the_store_and_a_bad_one_stops_the_erasure(tmp_path):
    from click.testing import CliRunner

    from tombstone import init_deployment
    from tombstone.capture import HashingEmbedder
    from tombstone.cli import main

    FaissStore(tmp_path / "d" / "stores" / "vec", dim=32)
    config = init_deployment(tmp_path / "d", {"vec": {"backend": "faiss", "path": "stores/vec", "threads": 1}})
    with Tombstone(config) as tomb:
        FaissStore(tmp_path / "d" / "stores" / "vec", lineage=tomb.lineage, store="vec",
                   embedder=HashingEmbedder(32)).add(["alice-1"], documents=["alice's note"], subject="alice")
        adapter = tomb.adapter("vec")
        assert adapter.faiss.threads == 1
    text = config.path.read_text().replace("threads = 1", 'threads = "many"')
    config.path.write_text(text)
    result = CliRunner().invoke(main, ["erase", "alice", "--config", str(config.path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "threads must be a whole number" in lines[0] and "Traceback" not in result.output
    with Tombstone.open(config.path) as tomb:
        assert tomb.lineage.sagas() == []  # refused before anything changed
