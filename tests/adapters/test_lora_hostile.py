"""A model store whose registry was written by someone else: a FIFO or a link to /dev/zero where the registry
should be, an oversized registry, entries naming files outside the store (``../``, an absolute path, a folder
that is a link out of the store). Each is refused in one line; nothing outside the store is read, written or
deleted; the affected artifacts are never VERIFIED. And the store's folders are 0700, its files 0600.

The erasures run on a deployment trained once per module with the smallest model that trains (a second or
two on two cores), copied for each test; every command that could hang runs in a subprocess with a timeout."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tombstone.errors import ConfigError, StoreUnavailableError
from tombstone.testing import crash
from tombstone_adapters.lora import LoraStore, ModelConfig
from tombstone_adapters.lora import synthetic as S

TIMEOUT = 120
SUBJECT = crash.SUBJECT  # user-0001: trained into a shard


def tiny() -> ModelConfig:
    return ModelConfig.from_dict({**ModelConfig.ci().to_dict(), "n_embd": 16, "n_head": 2, "n_layer": 1,
                                  "lora_r": 2, "base_steps": 2, "steps": 2, "unlearn_steps": 1, "batch_size": 4})


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lora-hostile") / "template"
    S.build_deployment(root, subjects=3, examples=2, shards=2, holdout_subjects=1, config=tiny(), base_texts=8)
    return root


def deployment(template: Path, dst: Path) -> Path:
    crash.copy_deployment(template, dst)
    return dst


def registry_of(root: Path) -> dict:
    return json.loads((root / "stores/model/registry.json").read_text())


def shard_of_subject(reg: dict) -> str:
    return next(name for name, e in reg["shards"].items() if f"ex-{SUBJECT}-00" in e["examples"])


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tombstone", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=TIMEOUT)


OPEN = """
import sys
from tombstone.errors import TombstoneError
from tombstone_adapters.lora.adapter import LoraAdapter
try:
    LoraAdapter("model", {"path": sys.argv[1]})
except TombstoneError as exc:
    print("REFUSED", type(exc).__name__, exc)
    sys.exit(0)
print("OPENED")
"""


@pytest.mark.parametrize("plant", ["fifo", "dev-zero"])
def test_a_registry_that_is_a_fifo_or_a_link_to_dev_zero_is_refused_on_opening(tmp_path, plant):
    root = tmp_path / "model"
    LoraStore(root)  # a store with a registry and nothing trained: enough to open
    registry = root / "registry.json"
    registry.unlink()
    if plant == "fifo":
        os.mkfifo(registry)
    else:
        registry.symlink_to("/dev/zero")
    result = subprocess.run([sys.executable, "-c", OPEN, str(root)], capture_output=True, text=True, timeout=TIMEOUT)
    out = result.stdout.strip()
    assert result.returncode == 0 and out.startswith("REFUSED "), result.stdout + result.stderr[-3000:]
    assert "\n" not in out and str(registry) in out
    assert ("a FIFO" if plant == "fifo" else "a symbolic link") in out, out


def test_a_registry_over_the_metadata_limit_or_of_the_wrong_shape_is_refused(tmp_path):
    root = tmp_path / "model"
    LoraStore(root)
    size = (root / "registry.json").stat().st_size
    with pytest.raises(StoreUnavailableError, match="over the limit .* max_metadata_bytes"):
        LoraStore(root, create=False, max_metadata_bytes=size - 1).registry()
    assert LoraStore(root, create=False, max_metadata_bytes=size).registry()["shards"] == {}  # control
    with pytest.raises(ConfigError, match="max_weights_bytes"):
        LoraStore(root, create=False, max_weights_bytes="lots")
    reg = json.loads((root / "registry.json").read_text())
    (root / "registry.json").write_text(json.dumps({**reg, "shards": {"shard-00": {"file": 7, "examples": []}}}))
    with pytest.raises(StoreUnavailableError, match="shard 'shard-00' names its weights file"):
        LoraStore(root, create=False).registry()
    (root / "registry.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StoreUnavailableError, match="registry.json is not JSON"):
        LoraStore(root, create=False).registry()


@pytest.mark.slow
def test_erasing_with_a_fifo_for_a_registry_stops_in_one_line_and_never_hangs(template, tmp_path):
    root = deployment(template, tmp_path / "deploy")
    registry = root / "stores/model/registry.json"
    registry.unlink()
    os.mkfifo(registry)
    for args in (["erase", SUBJECT], ["audit", f"receipts/{SUBJECT}.json"]):
        result = run(*args, "--config", str(root / "tombstone.toml"), cwd=root)
        if args[0] == "erase":
            assert result.returncode == 2, result.stdout + result.stderr
            assert result.stderr.count("\n") == 1 and "registry.json is a FIFO" in result.stderr, result.stderr
        else:  # no receipt was written: the audit says so, and does not wait on the FIFO either
            assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["dotdot", "absolute", "folder-link"])
def test_a_registry_entry_leaving_the_store_deletes_nothing_and_is_not_verified(template, tmp_path, attack):
    root = deployment(template, tmp_path / "deploy")
    store = root / "stores/model"
    reg = registry_of(root)
    shard = shard_of_subject(reg)
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.safetensors"
    victim.write_bytes(b"a file of someone else's, outside the model store\n")
    before = victim.read_bytes()
    if attack == "dotdot":
        reg["shards"][shard]["file"] = os.path.relpath(victim, store)
    elif attack == "absolute":
        reg["shards"][shard]["file"] = str(victim)
    else:  # the weights folder is a link to a folder outside the store: its files look like the store's
        for path in (store / "adapters").iterdir():
            path.rename(outside / path.name)
        (store / "adapters").rmdir()
        (store / "adapters").symlink_to(outside)
    (store / "registry.json").write_text(json.dumps(reg))
    result = run("erase", SUBJECT, "--config", str(root / "tombstone.toml"), "--out", str(root / "receipt.json"),
                 cwd=root)
    assert result.returncode == 3, result.stdout + result.stderr  # written, but a person must act
    assert victim.read_bytes() == before
    receipt = json.loads((root / "receipt.json").read_text())
    model = [a for a in receipt["artifacts"] if a["store"] == "model"]
    assert model and all(a["artifact_id"].startswith(f"{shard}:") for a in model)
    for entry in model:
        assert entry["status"] in ("UNVERIFIED", "NEEDS_HUMAN"), entry
        assert f"shards.{shard}.file" in entry["reason"] and "leaves the store" in entry["reason"], entry["reason"]
    others = {a["status"] for a in receipt["artifacts"] if a["store"] != "model"}
    assert others == {"VERIFIED"}  # control: the other stores were erased and verified


@pytest.mark.slow
def test_the_model_store_folders_are_0700_and_its_files_0600(template, tmp_path):
    root = deployment(template, tmp_path / "deploy")
    result = run("erase", SUBJECT, "--config", str(root / "tombstone.toml"), cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr  # the erasure retrained a shard: new weights
    store = root / "stores/model"
    folders = [store] + [p for p in store.rglob("*") if p.is_dir()]
    files = [p for p in store.rglob("*") if p.is_file()]
    assert {p.name for p in folders} >= {"model", "adapters", "base"} and len(files) >= 3
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {str(p): "0o700" for p in folders}
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {str(p): "0o600" for p in files}
