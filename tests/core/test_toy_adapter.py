"""A third-party adapter, registered through the entry-point group by a distribution of its own, gets
``tombstone demo``, ``tombstone check`` and the whole verification pipeline with no change to the core.

The toy store is a JSON-lines file; the distribution is a ``.dist-info`` folder on ``PYTHONPATH``, exactly
what ``pip install`` of a third-party package would leave behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TOY_MODULE = textwrap.dedent('''
    """A toy backend: records in one JSON-lines file, a "hidden" flag, rewrite to reclaim."""

    import hashlib
    import json
    from pathlib import Path

    from tombstone import Adapter, ArtifactRecord, Capability, Level, ProbeResult


    def _read(path):
        p = Path(path)
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


    def _write(path, rows):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("".join(json.dumps(r) + "\\n" for r in rows))


    class ToyAdapter(Adapter):
        backend = "toy"
        capabilities = frozenset({Capability.HIDE, Capability.RECLAIM, Capability.LOGICAL_PROBE,
                                  Capability.PHYSICAL_SCAN, Capability.SEMANTIC_PROBE})
        demo_role = "documents"

        def suppress(self, artifacts):
            ids = {a.artifact_id for a in artifacts}
            rows = _read(self.options["path"])
            for row in rows:
                row["hidden"] = row["hidden"] or row["id"] in ids
            _write(self.options["path"], rows)
            return {"mechanism": "hidden flag"}

        def reclaim(self, artifacts):
            ids = {a.artifact_id for a in artifacts}
            _write(self.options["path"], [r for r in _read(self.options["path"]) if r["id"] not in ids])
            return {"steps": ["rewrite"]}

        def native_delete(self, artifacts):
            self.suppress(artifacts)

        def probe_logical(self, artifacts, probe_vectors=None):
            visible = {r["id"] for r in _read(self.options["path"]) if not r["hidden"]}
            return {a.artifact_id: ProbeResult(Level.LOGICAL, a.artifact_id not in visible,
                                               "returned by read" if a.artifact_id in visible else None)
                    for a in artifacts}

        def physical_files(self):
            return [Path(self.options["path"])]

        @classmethod
        def demo_store(cls, kit):
            return {"backend": "toy", "path": "stores/toy/records.jsonl"}

        @classmethod
        def demo_fill(cls, kit, store, options, subjects):
            rows = _read(options["path"])
            for subject in subjects:
                docs = kit.documents(subject)
                rows += [{"id": doc_id, "text": text, "hidden": False} for doc_id, text, _ in docs]
                kit.lineage.record_artifacts(subject, [
                    ArtifactRecord(store, doc_id, "toy", "document",
                                   content_hash=hashlib.sha256(text.encode()).hexdigest())
                    for doc_id, text, _ in docs])
            _write(options["path"], rows)
''')


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("toy-site")
    (site / "toy_tombstone.py").write_text(TOY_MODULE)
    info = site / "toy_tombstone-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-tombstone\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tombstone.adapters]\ntoy = toy_tombstone:ToyAdapter\n")
    return site


def cli(toy_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_path), os.environ.get("PYTHONPATH", "")]),
           "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.slow
def test_demo_builds_and_erases_a_third_party_backend(toy_path, tmp_path):
    listed = cli(toy_path, "backends")
    assert listed.returncode == 0 and "toy" in listed.stdout, listed.stderr
    root = tmp_path / "demo"
    result = cli(toy_path, "demo", "--workdir", str(root), "--backends", "toy", "--subjects", "2")
    assert result.returncode == 0, result.stderr
    receipt = json.loads((root / "receipts" / "user-0001.json").read_text())
    assert {a["backend"] for a in receipt["artifacts"]} == {"toy"} and len(receipt["artifacts"]) == 3
    assert {(a["status"], a["level"]) for a in receipt["artifacts"]} == {("VERIFIED", "physical")}
    probes = receipt["artifacts"][0]["evidence"]["probes"]
    assert [p["level"] for p in probes] == ["logical", "physical", "semantic", "model"]
    # the semantic stage runs for a store that declares it, and says plainly that it is not implemented yet
    assert probes[2]["ran"] is False and "not implemented" in probes[2]["detail"]["why"]
    assert probes[3]["ran"] is False and "holds no model weights" in probes[3]["detail"]["why"]
    # the survivor's records are untouched; the erased subject's are gone from the file
    text = (root / "stores" / "toy" / "records.jsonl").read_text()
    assert all(a["artifact_id"] not in text for a in receipt["artifacts"])
    assert text.count('"id"') == 3


@pytest.mark.slow
def test_check_gates_a_third_party_backend(toy_path, tmp_path):
    result = cli(toy_path, "check", "--backend", "toy", "--canaries", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "toy: PASS (6/6" in result.stdout


@pytest.mark.slow
def test_check_fails_a_third_party_backend_whose_reclaim_leaves_bytes(toy_path, tmp_path):
    """Control: the same gate fails when the toy's reclaim does nothing (the rows stay in the file)."""
    broken = toy_path.parent / "toy-broken"
    if not broken.exists():
        broken.mkdir()
        source = (toy_path / "toy_tombstone.py").read_text()
        (broken / "toy_tombstone.py").write_text(source.replace(
            '_write(self.options["path"], [r for r in _read(self.options["path"]) if r["id"] not in ids])', "pass"))
        (broken / "toy_tombstone-0.1.dist-info").mkdir()
        for name in ("METADATA", "entry_points.txt"):
            (broken / "toy_tombstone-0.1.dist-info" / name).write_text(
                (toy_path / "toy_tombstone-0.1.dist-info" / name).read_text())
    result = cli(broken, "check", "--backend", "toy", "--canaries", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "RESIDUAL(physical" in result.stdout and "toy: FAIL" in result.stdout
