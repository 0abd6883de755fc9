"""`tombstone receipt list` and `tombstone receipt export`: the sealed copies the lineage db keeps, out to an
auditor who checks the chain with `tombstone audit --previous`."""

from __future__ import annotations

import json

import pytest

from tombstone.testing.crash import cli


def one_line_error(result, code: int = 2) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def erased(tmp_path_factory):
    """A deployment with three receipts: user-0001, user-0002, user-0001 again."""
    root = tmp_path_factory.mktemp("export") / "d"
    built = cli("demo", "--workdir", str(root), "--backends", "docstore", "--subjects", "2", "--erase", "none")
    assert built.returncode == 0, built.stderr
    for subject in ("user-0001", "user-0002", "user-0001"):
        done = cli("erase", subject, "--config", str(root / "tombstone.toml"))
        assert done.returncode == 0, done.stderr
    return root


def test_list_shows_every_receipt(erased):
    config = str(erased / "tombstone.toml")
    listed = cli("receipt", "list", "--config", config)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()[2:]
    assert [row.split()[:2] for row in rows] == [["1", "user-0001"], ["2", "user-0002"], ["3", "user-0001"]]
    for path in (erased / "receipts").glob("*.json"):
        receipt = json.loads(path.read_text())
        row = rows[receipt["sequence"] - 1]
        assert receipt["saga_id"] in row and receipt["receipt_hash"] in row and receipt["finished_at"] in row
        assert "VERIFIED 3" in row
    mine = cli("receipt", "list", "--config", config, "--subject", "user-0001").stdout.splitlines()[2:]
    assert [row.split()[0] for row in mine] == ["1", "3"]
    none = cli("receipt", "list", "--config", config, "--subject", "nobody")
    assert none.returncode == 0 and "no receipts for 'nobody'" in none.stdout


def test_export_all_then_audit_checks_the_chain(erased, tmp_path):
    config = str(erased / "tombstone.toml")
    out = tmp_path / "for-the-auditor"
    exported = cli("receipt", "export", "--config", config, "--all", "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    files = sorted(out.iterdir())
    assert [f.name for f in files] == ["receipt-000001.json", "receipt-000002.json", "receipt-000003.json"]
    # the sealed copies are the delivered receipts, byte for byte
    delivered = {json.loads(p.read_text())["sequence"]: p.read_bytes() for p in (erased / "receipts").glob("*.json")}
    assert {n + 1: f.read_bytes() for n, f in enumerate(files)} == delivered
    head = cli("receipt", "head", "--config", config).stdout.strip()
    audited = cli("audit", str(files[-1]), "--config", config, "--previous", str(files[0]),
                  "--previous", str(files[1]), "--anchor", head)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert "chain:     ok (3 receipts, #1..#3, anchored)" in audited.stdout
    for f in files:
        assert cli("receipt", "verify", str(f), "--config", config).returncode == 0
    # without the middle receipt the auditor sees the gap
    gap = cli("audit", str(files[-1]), "--config", config, "--previous", str(files[0]))
    assert gap.returncode == 1 and "#2 is missing" in gap.stdout
    # exporting again into the same directory changes nothing and is fine
    again = cli("receipt", "export", "--config", config, "--all", "--out", str(out))
    assert again.returncode == 0, again.stderr


def test_export_one_receipt_by_sequence_or_saga(erased, tmp_path):
    config = str(erased / "tombstone.toml")
    second = json.loads((erased / "receipts" / "user-0002.json").read_text())
    by_seq = cli("receipt", "export", "--config", config, "--sequence", "2", "--out", str(tmp_path / "two.json"))
    assert by_seq.returncode == 0, by_seq.stderr
    assert (tmp_path / "two.json").read_bytes() == (erased / "receipts" / "user-0002.json").read_bytes()
    (tmp_path / "dir").mkdir()
    by_saga = cli("receipt", "export", "--config", config, "--saga", second["saga_id"], "--out", str(tmp_path / "dir"))
    assert by_saga.returncode == 0, by_saga.stderr
    assert (tmp_path / "dir" / "receipt-000002.json").read_bytes() == (tmp_path / "two.json").read_bytes()


def test_export_bad_input_is_one_line_and_writes_nothing(erased, tmp_path):
    config = str(erased / "tombstone.toml")
    out = tmp_path / "out"
    assert "exactly one of" in one_line_error(cli("receipt", "export", "--config", config, "--out", str(out)))
    assert "exactly one of" in one_line_error(
        cli("receipt", "export", "--config", config, "--all", "--sequence", "1", "--out", str(out)))
    assert "--out" in one_line_error(cli("receipt", "export", "--config", config, "--all"))
    assert "no receipt #9" in one_line_error(
        cli("receipt", "export", "--config", config, "--sequence", "9", "--out", str(out)))
    assert "receipt number" in one_line_error(
        cli("receipt", "export", "--config", config, "--sequence", "x", "--out", str(out)))
    assert "no saga" in one_line_error(
        cli("receipt", "export", "--config", config, "--saga", "nope", "--out", str(out)))
    assert not out.exists()
    out.mkdir()
    (out / "receipt-000002.json").write_text("something else\n")
    err = one_line_error(cli("receipt", "export", "--config", config, "--all", "--out", str(out)))
    assert "refusing to overwrite" in err
    assert sorted(p.name for p in out.iterdir()) == ["receipt-000002.json"]
    assert (out / "receipt-000002.json").read_text() == "something else\n"
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert "is a file" in one_line_error(cli("receipt", "export", "--config", config, "--all", "--out", str(afile)))
