"""Batches: one reclaim and one probe pass per store for many subjects, one receipt each."""

from __future__ import annotations

import shutil

from tombstone import Tombstone

from test_cli import one_line_error, run


def statuses(receipt):
    return {(a["store"], a["artifact_id"]): (a["status"], a["level"], a["reason"]) for a in receipt["artifacts"]}


def test_batch_equals_single_erasures_with_one_pass_per_store(tmp_path, monkeypatch):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--subjects", "5", "--erase", "none").exit_code == 0
    single = tmp_path / "single"
    shutil.copytree(root, single)
    subjects = ["user-0001", "user-0003", "user-0004"]
    with Tombstone.open(single / "tombstone.toml") as tomb:
        one_by_one = {s: statuses(tomb.erase(s)[0]) for s in subjects}

    from tombstone_adapters.chroma.adapter import ChromaAdapter
    from tombstone_adapters.docstore.adapter import DocstoreAdapter

    calls = {"reclaim": 0, "probe_physical": 0}
    for cls in (ChromaAdapter, DocstoreAdapter):
        for name in calls:
            real = getattr(cls, name)

            def counting(self, *args, _real=real, _name=name, **kwargs):
                if type(self) in (ChromaAdapter, DocstoreAdapter):
                    calls[_name] += 1
                return _real(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, counting)
    listing = tmp_path / "subjects.txt"
    listing.write_text("\n".join(["# erasure requests, week 48", *subjects, ""]))
    result = run("erase", "--subjects-file", str(listing), "--config", str(root / "tombstone.toml"))
    assert result.exit_code == 0, result.output
    assert calls == {"reclaim": 2, "probe_physical": 2}, "one reclaim and one scan per store for the whole batch"
    import json

    for subject in subjects:
        receipt = json.loads((root / "receipts" / f"{subject}.json").read_text())
        assert statuses(receipt) == one_by_one[subject]
        assert receipt["artifacts"][0]["evidence"]["reclaim"]["batch_subjects"] == 3
    assert run("receipt", "verify", str(root / "receipts" / "user-0004.json")).exit_code == 0


def test_unknown_subject_in_a_batch_stops_it_before_anything(tmp_path):
    root = tmp_path / "d"
    assert run("demo", "--workdir", str(root), "--backends", "docstore", "--erase", "none").exit_code == 0
    listing = tmp_path / "subjects.txt"
    listing.write_text("user-0001\nnobody\n")
    err = one_line_error(run("erase", "--subjects-file", str(listing), "--config", str(root / "tombstone.toml")), 2)
    assert "unknown subject 'nobody'" in err
    assert "no erasure has been run" in run("status", "--config", str(root / "tombstone.toml")).output
    one_line_error(run("erase", "--config", str(root / "tombstone.toml")), 2)
    one_line_error(run("erase", "user-0001", "--subjects-file", str(listing), "--config", str(root / "tombstone.toml")), 2)
