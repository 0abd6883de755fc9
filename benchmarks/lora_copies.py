"""Model weights: copies of a shard's retired weights left in the model store, and whether the physical probe
finds them. A small deployment (``ModelConfig.ci()``'s model with short training: 5 people, 2 shards) is
trained and one subject erased, which retrains her shard and retires its weights; then each case of
``tombstone_adapters.lora.copies`` is planted in a copy of the erased model store and the physical probe run
on her model artifacts. Next to it, what the check by whole-file SHA-256 alone (the check before tensors were
recorded) would have said."""

from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import time
from pathlib import Path

HEADINGS = ("Model weights: copies of retired weights",)
SUBJECT = "user-0001"


def _config():
    from tombstone_adapters.lora import ModelConfig

    return ModelConfig.from_dict({**ModelConfig.ci().to_dict(), "base_steps": 30, "steps": 30, "unlearn_steps": 10})


def _probe(adapter, arts, name: str) -> tuple[str, str]:
    """What the physical probe says of the planted file: found, not found or unverified, and its words."""
    from tombstone.errors import PhysicalUnsupportedError

    try:
        results = adapter.probe_physical(arts)
    except PhysicalUnsupportedError as exc:
        return ("unverified" if name in str(exc) else "unverified (another file)"), str(exc)
    failed = [r.measurement for r in results.values() if not r.passed]
    if not failed:
        return "not found", ""
    return ("found" if all(name in m for m in failed) and len(failed) == len(results) else "found (partly)"), failed[0]


def run(tmp: Path) -> dict:
    from tombstone_adapters.lora import copies as C
    from tombstone_adapters.lora import synthetic as S
    from tombstone_adapters.lora.adapter import LoraAdapter
    from tombstone_adapters.lora.tensors import tensors_of

    from tombstone import Tombstone
    from tombstone.config import load_config

    root = tmp / "deploy"
    config = _config()
    start = time.perf_counter()
    S.build_deployment(root, subjects=5, examples=2, shards=2, holdout_subjects=1, config=config, base_texts=40)
    toml = root / "tombstone.toml"
    toml.write_text(toml.read_text().replace("[tombstone]\n", '[tombstone]\nlevels = ["logical", "physical"]\n', 1))
    store = root / "stores/model"
    reg = json.loads((store / "registry.json").read_text())
    shard = next(n for n, e in reg["shards"].items() if f"ex-{SUBJECT}-00" in e["examples"])
    old = (store / reg["shards"][shard]["file"]).read_bytes()
    old_sha = hashlib.sha256(old).hexdigest()
    with Tombstone(load_config(toml)) as tomb:
        receipt, _ = tomb.erase(SUBJECT)
        arts = [a for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(SUBJECT)) if a.store == "model"]
    setup_seconds = time.perf_counter() - start
    control = sorted({f"{a['status']}({a['level'] or a['reason']})" for a in receipt["artifacts"] if a["store"] == "model"})
    cases = [("copy", c, f, d) for c, (f, d) in C.copies(old).items()]
    cases += [("unrelated", c, f, d) for c, (f, d) in C.unrelated(old).items()]
    cases += [("broken", c, f, d) for c, (f, d) in C.broken(old).items()]
    rows, seconds = [], []
    for i, (group, case, name, data) in enumerate([("control", "no copy", "", b"")] + cases):
        copy = tmp / f"case-{i}"
        shutil.copytree(store, copy)
        if name:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes(data)
        adapter = LoraAdapter("model", {"path": str(copy)})
        t = time.perf_counter()
        outcome, words = _probe(adapter, arts, name or "\0")
        seconds.append(time.perf_counter() - t)
        whole = "found" if name and hashlib.sha256(data).hexdigest() == old_sha else "not found"
        rows.append({"group": group, "case": case, "file": name, "bytes": len(data), "outcome": outcome,
                     "whole_file": whole, "words": words})
        shutil.rmtree(copy)
    tensors = tensors_of(old)
    return {"config": config.to_dict(), "shard": shard, "weights_bytes": len(old), "tensors": len(tensors),
            "control_receipt": control, "rows": rows, "probe_seconds": statistics.median(seconds),
            "setup_seconds": setup_seconds, "files_in_store": sum(1 for p in store.rglob("*") if p.is_file())}


def _expected(group: str) -> str:
    return {"control": "not found", "copy": "found", "unrelated": "not found", "broken": "unverified"}[group]


def section(result: dict) -> str:
    cfg = result["config"]
    lines = [
        f"## {HEADINGS[0]}",
        "",
        (f"A 2-layer GPT-2 over bytes ({cfg['n_embd']} wide) with 2 LoRA shards (rank {cfg['lora_r']},"
        f" {cfg['steps']} steps) over 5 people, one held out; {SUBJECT} erased, which retrains {result['shard']} and"
        f" retires its weights ({result['weights_bytes']:,} bytes of safetensors, {result['tensors']} tensors; the"
        " registry records a tag of each tensor's digest, never the digest). Each file below is planted in a copy of"
        " the erased model store and the physical probe run on her model artifacts: *found* (the artifacts"
        " RESIDUAL, the file named), *not found* (nothing of the retired weights) or *unverified* (the file looks"
        " like weights but cannot be decoded: the artifacts UNVERIFIED, the file named). The last column is what"
        " comparing each file's whole SHA-256 with the retired weights' (the check before tensors were recorded)"
        " says. Without a copy, the erasure's own receipt for her model artifacts:"
        f" {', '.join(result['control_receipt'])}."),
        "",
        "| case | file planted | bytes | physical probe | as expected | whole-file SHA-256 alone |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        ok = "yes" if row["outcome"] == _expected(row["group"]) else "**no**"
        lines.append(f"| {row['case']} | {row['file'] or '(none)'} | {row['bytes']:,} | {row['outcome']} | {ok} |"
                     f" {row['whole_file']} |")
    found = next((r["words"] for r in result["rows"] if r["case"] == "re-saved: every tensor renamed"), "")
    bad = next((r["words"] for r in result["rows"] if r["group"] == "broken"), "")
    lines += [
        "",
        (f"The probe reads every file of the store ({result['files_in_store']} here before a case is planted) by"
        f" content, whatever its name: {result['probe_seconds'] * 1000:.0f} ms per probe (median over the cases)"
        f" on two shared CPU cores. What it says of the renamed copy: \"{found}\"; of the truncated file:"
        f" \"{bad}\". Not found by design (verification-levels.md, Model weights): tensors converted to another"
        " dtype or quantised, merged into a base model, pickled torch files, archives (tar, zip), and copies outside"
        " the model store directory."),
    ]
    return "\n".join(lines)
