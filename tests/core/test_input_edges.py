"""Input a new user hands Tombstone by mistake: each is refused in one line (exit 2 on the command line, one of
Tombstone's own errors in the API) before anything is read past a bound, waited on, written or erased."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tombstone import Tombstone, init_deployment
from tombstone.errors import AdapterNotFoundError, ConfigError, LineageError, TombstoneError, UnknownSubjectError
from tombstone.inputs import CONFIG_LIMIT, MAX_SUBJECT_CHARS, SUBJECTS_FILE_LIMIT

from support import write_docs
from test_cli import one_line_error, run

TIMEOUT = 60
"""Seconds a command that could hang (a FIFO, a device) is given before the test fails."""


@pytest.fixture
def deploy(tmp_path):
    from tombstone_adapters.docstore import DocStore

    config = init_deployment(tmp_path / "d", {"docs": {"backend": "docstore", "path": "stores/docs/docstore.db"}})
    DocStore(config.stores["docs"].options["path"]).close()
    with Tombstone(config) as tomb:
        write_docs(tomb, "alice", 1)
        write_docs(tomb, "bob", 1)
    return config


def nothing_erased(config) -> None:
    with Tombstone.open(config.path) as tomb:
        assert tomb.lineage.sagas() == []
    assert not config.receipts_dir.exists() or not any(config.receipts_dir.iterdir())


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """The real console entry point in a subprocess, bounded by TIMEOUT (for what could block or read forever)."""
    return subprocess.run([sys.executable, "-m", "tombstone", *args], input=stdin, capture_output=True,
                          timeout=TIMEOUT, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def one_line(done: subprocess.CompletedProcess, code: int = 2) -> str:
    err = done.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert done.returncode == code, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# -- subjects files --------------------------------------------------------------------------------------------

BAD_SUBJECTS_FILES = {
    "utf-16 without a BOM": "alice\nbob\n".encode("utf-16-le"),
    "utf-16 big-endian without a BOM": "alice\nbob\n".encode("utf-16-be"),
    "a NUL byte in UTF-8": b"alice\nb\x00ob\n",
    "latin-1, not UTF-8": "alice\nren\u00e9e\n".encode("latin-1"),
}
"""Subjects files in an encoding Tombstone does not read: each is refused whole, with the encoding hint."""


@pytest.mark.parametrize("name", sorted(BAD_SUBJECTS_FILES))
def test_a_subjects_file_that_is_not_utf8_text_is_refused_with_the_encoding_hint(deploy, tmp_path, name):
    subjects = tmp_path / "subjects.txt"
    subjects.write_bytes(BAD_SUBJECTS_FILES[name])
    err = one_line_error(run("erase", "--subjects-file", str(subjects), "--config", str(deploy.path)), 2)
    assert "save it as UTF-8, one subject per line" in err and "line" in err, err
    assert "\\u0000" not in err
    nothing_erased(deploy)


def test_a_subjects_file_in_utf16_with_a_bom_is_still_read(deploy, tmp_path):
    subjects = tmp_path / "subjects.txt"
    subjects.write_bytes("alice\nbob\n".encode("utf-16"))
    result = run("erase", "--subjects-file", str(subjects), "--config", str(deploy.path))
    assert result.exit_code == 0, result.output
    assert "2 subjects erased in one batch" in result.output


def test_subjects_file_dash_reads_standard_input(deploy):
    from click.testing import CliRunner

    from tombstone.cli import main

    result = CliRunner().invoke(main, ["erase", "--subjects-file", "-", "--config", str(deploy.path)],
                                input="alice\n# a comment\n\nbob\n", catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "2 subjects erased in one batch" in result.output


def test_subjects_file_dash_refuses_utf16_without_a_bom_on_standard_input(deploy):
    done = cli("erase", "--subjects-file", "-", "--config", str(deploy.path), stdin="alice\n".encode("utf-16-le"))
    assert "save it as UTF-8" in one_line(done)
    nothing_erased(deploy)


# -- subject length ---------------------------------------------------------------------------------------------

def test_a_megabyte_subject_is_refused_on_the_command_line_and_not_echoed(deploy):
    huge = "x" * (1 << 20)
    err = one_line_error(run("erase", huge, "--config", str(deploy.path)), 2)
    assert f"the limit is {MAX_SUBJECT_CHARS}" in err and len(err) < 300, err[:300]
    nothing_erased(deploy)


def test_a_subjects_file_line_over_the_limit_is_refused_naming_its_line(deploy, tmp_path):
    subjects = tmp_path / "subjects.txt"
    subjects.write_text("alice\n" + "y" * (MAX_SUBJECT_CHARS + 1) + "\n")
    err = one_line_error(run("erase", "--subjects-file", str(subjects), "--config", str(deploy.path)), 2)
    assert "line 2" in err and f"the limit is {MAX_SUBJECT_CHARS}" in err and len(err) < 300
    nothing_erased(deploy)


def test_the_subject_limit_counts_characters_after_nfc(deploy):
    from tombstone_adapters.docstore import DocStore

    composed = "\u00e9" * MAX_SUBJECT_CHARS  # the same subject spelt decomposed is twice as long before NFC
    decomposed = "e\u0301" * MAX_SUBJECT_CHARS
    with Tombstone(deploy) as tomb:
        docs = DocStore(deploy.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
        docs.add("long-1", "some text", subject=decomposed)
        with pytest.raises(UnknownSubjectError, match=f"the limit is {MAX_SUBJECT_CHARS}"):
            docs.add("long-2", "some text", subject=composed + "x")
        docs.close()
        assert tomb.lineage.has_artifacts(tomb.lineage.subject_key(composed))
        assert not tomb.lineage.artifact("docs", "long-2")


def test_the_api_refuses_an_oversized_subject_everywhere(deploy):
    from tombstone_adapters.docstore import DocStore

    huge = "z" * (MAX_SUBJECT_CHARS + 1)
    with Tombstone(deploy) as tomb:
        docs = DocStore(deploy.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
        for call in (lambda: docs.add("d-1", "text", subject=huge), lambda: tomb.erase(huge),
                     lambda: tomb.erase_many(["alice", huge])):
            with pytest.raises(UnknownSubjectError, match=f"the limit is {MAX_SUBJECT_CHARS}") as caught:
                call()
            assert "\n" not in str(caught.value) and len(str(caught.value)) < 300
        docs.close()
        assert tomb.lineage.sagas() == [] and not tomb.lineage.artifact("docs", "d-1")


# -- the API's own errors ---------------------------------------------------------------------------------------

BAD_API_SUBJECTS = {"empty": "", "blank": "   ", "None": None, "a number": 123, "a NUL": "al\x00ice",
                    "a lone surrogate": "al\ud800ice"}
"""Subject references no write and no erasure takes: each raises UnknownSubjectError."""


@pytest.mark.parametrize("name", sorted(BAD_API_SUBJECTS))
def test_a_wrapper_write_refuses_a_subject_that_could_never_be_erased(deploy, name):
    from tombstone_adapters.docstore import DocStore

    with Tombstone(deploy) as tomb:
        docs = DocStore(deploy.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
        with pytest.raises(UnknownSubjectError):
            docs.add("orphan-1", "text nobody could erase", subject=BAD_API_SUBJECTS[name])
        docs.close()
        assert tomb.lineage.artifact("docs", "orphan-1") is None
    from tombstone_adapters.docstore import DocStore as Bare

    bare = Bare(deploy.stores["docs"].options["path"])
    assert bare.get("orphan-1") is None  # nothing stored either
    bare.close()


@pytest.mark.parametrize("name", sorted(BAD_API_SUBJECTS))
def test_erase_refuses_a_bad_subject_with_tombstones_own_error(deploy, name):
    with Tombstone(deploy) as tomb:
        with pytest.raises(UnknownSubjectError):
            tomb.erase(BAD_API_SUBJECTS[name])
        assert tomb.lineage.sagas() == []


def test_the_api_and_the_cli_say_the_same_about_an_empty_subject(deploy):
    with Tombstone(deploy) as tomb, pytest.raises(UnknownSubjectError) as caught:
        tomb.erase("   ")
    err = one_line_error(run("erase", "   ", "--config", str(deploy.path)), 2)
    assert err == f"error: {caught.value}"


def test_a_vector_wrapper_refuses_an_empty_subject_and_an_unconfigured_store(tmp_path):
    import chromadb

    from tombstone.capture import HashingEmbedder
    from tombstone_adapters.chroma import TombstoneCollection

    config = init_deployment(tmp_path / "d", {"vectors": {"backend": "chroma", "path": "stores/vectors",
                                                          "collection": "docs"}})
    client = chromadb.PersistentClient(path=config.stores["vectors"].options["path"])
    col = client.create_collection("docs", embedding_function=None)
    with Tombstone(config) as tomb:
        good = TombstoneCollection(col, lineage=tomb.lineage, store="vectors", embedder=HashingEmbedder(32))
        with pytest.raises(UnknownSubjectError, match="empty"):
            good.add(ids=["c-1"], documents=["a chunk of text"], subject="")
        with pytest.raises(UnknownSubjectError):
            good.add(ids=["c-1"], documents=["a chunk of text"], subject=None)
        typo = TombstoneCollection(col, lineage=tomb.lineage, store="vector", embedder=HashingEmbedder(32))
        with pytest.raises(ConfigError, match="store 'vector' is not configured.*configured: vectors"):
            typo.add(ids=["c-2"], documents=["another chunk"], subject="alice")
        assert tomb.lineage.artifacts_for(tomb.lineage.subject_key("alice")) == []
    assert col.count() == 0


def test_a_write_to_a_store_missing_from_the_config_is_refused(deploy):
    from tombstone_adapters.docstore import DocStore

    with Tombstone(deploy) as tomb:
        docs = DocStore(deploy.stores["docs"].options["path"], lineage=tomb.lineage, store="nosuch")
        with pytest.raises(ConfigError, match="store 'nosuch' is not configured .*configured: docs"):
            docs.add("n-1", "text", subject="carol")
        docs.close()
        assert not tomb.lineage.has_artifacts(tomb.lineage.subject_key("carol"))


def test_init_deployment_refuses_a_backend_typo_and_lists_the_backends(tmp_path):
    with pytest.raises(AdapterNotFoundError) as caught:
        init_deployment(tmp_path / "d", {"docs": {"backend": "docstor", "path": "docs.db"}})
    message = str(caught.value)
    assert "did you mean 'docstore'" in message and "backends:" in message and "chroma" in message
    assert not (tmp_path / "d" / "tombstone.toml").exists()


def test_a_closed_tombstone_raises_its_own_error(deploy):
    from tombstone_adapters.docstore import DocStore

    tomb = Tombstone(deploy)
    docs = DocStore(deploy.stores["docs"].options["path"], lineage=tomb.lineage, store="docs")
    tomb.close()
    tomb.close()  # twice is harmless
    for call in (lambda: tomb.erase("alice"), lambda: tomb.erase_many(["alice"]), tomb.resume,
                 lambda: tomb.adapter("docs"), lambda: docs.add("late-1", "text", subject="alice")):
        with pytest.raises(LineageError, match="closed"):
            call()
    docs.close()
    nothing_erased(deploy)


# -- paths the user names -----------------------------------------------------------------------------------------

def _fifo(tmp_path: Path, name: str) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / name
    os.mkfifo(path)
    return path


def test_a_fifo_as_config_is_refused_at_once(deploy, tmp_path):
    fifo = _fifo(tmp_path, "config.toml")
    err = one_line(cli("status", "--config", str(fifo)))
    assert "FIFO" in err and "regular file" in err


def test_a_fifo_as_subjects_file_is_refused_at_once_with_the_stdin_hint(deploy, tmp_path):
    fifo = _fifo(tmp_path, "subjects")
    err = one_line(cli("erase", "--subjects-file", str(fifo), "--config", str(deploy.path)))
    assert "FIFO" in err and "--subjects-file -" in err
    nothing_erased(deploy)


def test_process_substitution_as_subjects_file_is_refused_and_stdin_taken(deploy):
    """``--subjects-file <(cmd)`` hands a pipe: refused (pipe it to ``-`` instead), never read unbounded."""
    if not Path("/dev/fd").is_dir():
        pytest.skip("no /dev/fd here")
    read, write = os.pipe()
    try:
        os.write(write, b"alice\n")
        done = subprocess.run([sys.executable, "-m", "tombstone", "erase", "--subjects-file", f"/dev/fd/{read}",
                               "--config", str(deploy.path)], capture_output=True, timeout=TIMEOUT, pass_fds=(read,),
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    finally:
        os.close(read)
        os.close(write)
    assert "--subjects-file -" in one_line(done)
    nothing_erased(deploy)


@pytest.mark.parametrize("option", ["--config", "--subjects-file"])
def test_dev_zero_is_refused_without_reading_it(deploy, option):
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    args = ["erase", "--subjects-file", "/dev/zero", "--config", str(deploy.path)] if option == "--subjects-file" \
        else ["erase", "alice", "--config", "/dev/zero"]
    err = one_line(cli(*args))
    assert "character device" in err and "MemoryError" not in err
    nothing_erased(deploy)


def test_a_directory_as_config_or_subjects_file_is_one_line(deploy, tmp_path):
    err = one_line_error(run("status", "--config", str(tmp_path)), 2)
    assert "is a directory" in err
    err = one_line_error(run("erase", "--subjects-file", str(tmp_path), "--config", str(deploy.path)), 2)
    assert "is a directory" in err


def test_an_oversized_config_or_subjects_file_is_refused_unread(deploy, tmp_path):
    big_config = tmp_path / "big.toml"
    big_config.write_bytes(deploy.path.read_bytes() + b"#" * CONFIG_LIMIT)
    err = one_line_error(run("status", "--config", str(big_config)), 2)
    assert "larger than 1 MiB" in err
    big_list = tmp_path / "subjects.txt"
    with open(big_list, "wb") as fh:  # sparse: no 64 MiB written
        fh.write(b"alice\n")
        fh.truncate(SUBJECTS_FILE_LIMIT + 1)
    err = one_line_error(run("erase", "--subjects-file", str(big_list), "--config", str(deploy.path)), 2)
    assert "larger than 64 MiB" in err
    nothing_erased(deploy)


def test_out_must_be_a_regular_file_or_a_new_path(deploy, tmp_path):
    fifo = _fifo(tmp_path, "receipt-fifo")
    err = one_line(cli("erase", "alice", "--out", str(fifo), "--config", str(deploy.path)))
    assert "FIFO" in err and "regular file or a new path" in err
    assert Path(fifo).is_fifo()  # not replaced by a receipt
    err = one_line_error(run("erase", "alice", "--out", str(tmp_path), "--config", str(deploy.path)), 2)
    assert "is a directory" in err
    nothing_erased(deploy)
    new = tmp_path / "receipts-here" / "alice.json"
    assert run("erase", "alice", "--out", str(new), "--config", str(deploy.path)).exit_code == 0
    assert new.is_file()


def test_out_on_a_character_device_is_refused(deploy, tmp_path):
    """``--out /dev/full`` (here a private node of the same device, so nothing outside the test is at risk)."""
    device = tmp_path / "full"
    try:
        os.mknod(device, 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 7))
    except (PermissionError, AttributeError, OSError):
        pytest.skip("cannot make a device node here")
    err = one_line(cli("erase", "alice", "--out", str(device), "--config", str(deploy.path)))
    assert "character device" in err
    assert device.is_char_device()
    with Tombstone(deploy) as tomb, pytest.raises(ConfigError, match="character device"):
        tomb.erase("alice", out=device)
    nothing_erased(deploy)


def _receipt(deploy):
    assert run("erase", "alice", "--config", str(deploy.path)).exit_code == 0
    return next(deploy.receipts_dir.glob("*.json"))


def test_a_key_that_is_a_device_a_fifo_or_huge_is_refused_unread(deploy, tmp_path):
    """``--key`` for receipt verify and audit: /dev/zero once ran out of memory (killed); a FIFO would wait."""
    receipt = _receipt(deploy)
    fifo = _fifo(tmp_path, "key-fifo")
    huge = tmp_path / "huge.pub"
    with open(huge, "wb") as fh:  # sparse: nothing big is written
        fh.write(b"-----BEGIN PUBLIC KEY-----\n")
        fh.truncate(1 << 30)
    cases = [(fifo, "FIFO"), (huge, "larger than 64 KiB")]
    if Path("/dev/zero").exists():
        cases.append((Path("/dev/zero"), "character device"))
    for key, says in cases:
        for command in ("receipt verify", "audit"):
            extra = ["--config", str(deploy.path)] if command == "audit" else []
            err = one_line(cli(*command.split(), str(receipt), "--key", str(key), *extra))
            assert says in err and "MemoryError" not in err, (command, err)
    good = cli("receipt", "verify", str(receipt), "--key", str(deploy.root / "keys" / "signing.pub"))
    assert good.returncode == 0, good.stderr  # the control: the real key still verifies


def test_junit_on_a_fifo_is_refused_before_any_canary_is_written(deploy, tmp_path):
    fifo = _fifo(tmp_path, "junit-fifo")
    err = one_line(cli("check", "--backend", "docstore", "--config", str(deploy.path), "--junit", str(fifo)))
    assert "--junit" in err and "FIFO" in err
    assert Path(fifo).is_fifo()
    nothing_erased(deploy)


# -- the demo's Pinecone store after its emulator stopped --------------------------------------------------------

@pytest.mark.slow
def test_erasing_after_the_demo_names_the_stopped_emulator_and_the_way_on(tmp_path, monkeypatch):
    monkeypatch.delenv("PINECONE_API_KEY", raising=False)
    root = tmp_path / "demo"
    built = run("demo", "--workdir", str(root), "--backends", "docstore,pinecone", "--subjects", "2")
    assert built.exit_code == 0, built.output
    config = str(root / "tombstone.toml")
    err = one_line_error(run("erase", "user-0002", "--config", config), 2)
    assert "emulator" in err and "stopped" in err and "--allow-missing-store pinecone" in err
    assert "https" not in err
    result = run("erase", "user-0002", "--config", config, "--allow-missing-store", "pinecone")
    assert result.exit_code == 3, result.output
    assert "pinecone:" in result.output and "UNVERIFIED" in result.output
