"""``tombstone check``: the CI gate for one backend's delete path.

Canary subjects — synthetic, named ``tombstone-canary-NNNN`` — are written through the backend's wrapper
into a scratch store (or, with a config, into the configured store's server in a collection, table,
directory or namespace of their own), erased, and each canary must end at the backend's highest
applicable level: VERIFIED(physical) for a self-hosted backend; for a managed one, UNVERIFIED(managed)
with a passing logical probe. Before erasing, the physical probe must find every canary (the control): a
probe that cannot find live bytes proves nothing when it later finds none.

Canaries use a scratch lineage db and keys, so they never enter the operator's receipt chain.
"""

from __future__ import annotations

import shutil
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tombstone.api import Tombstone, init_deployment
from tombstone.config import load_config
from tombstone.contract import Capability, adapter_class
from tombstone.errors import ConfigError

CANARY_PREFIX = "tombstone-canary-"
# Caches are derived stores (their entries need a source to be in lineage); check their backing stores.
CHECK_BACKENDS = ("chroma", "docstore", "faiss", "pgvector", "pinecone", "qdrant")


@dataclass
class CheckRow:
    """One canary artifact's outcome."""

    artifact_id: str
    subject: str
    status: str
    expected: str
    passed: bool
    detail: str = ""


@dataclass
class CheckResult:
    """The gate's verdict for one backend."""

    backend: str
    rows: list[CheckRow] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.rows) and not self.failures and all(r.passed for r in self.rows)

    def junit(self) -> str:
        suite = ET.Element("testsuite", name=f"tombstone check {self.backend}", tests=str(len(self.rows) + 1),
                           failures=str(sum(not r.passed for r in self.rows) + bool(self.failures)))
        control = ET.SubElement(suite, "testcase", classname=f"tombstone.check.{self.backend}", name="control")
        if self.failures:
            ET.SubElement(control, "failure", message="; ".join(self.failures)).text = "\n".join(self.failures)
        for row in self.rows:
            case = ET.SubElement(suite, "testcase", classname=f"tombstone.check.{self.backend}", name=row.artifact_id)
            if not row.passed:
                ET.SubElement(case, "failure", message=f"{row.status}, expected {row.expected}").text = row.detail
        return ET.tostring(suite, encoding="unicode")


def _canary_options(backend: str, options: dict[str, Any]) -> dict[str, Any]:
    """The configured store's options, pointed at a place of the canaries' own."""
    out = dict(options)
    if backend in ("chroma", "qdrant"):
        out["collection"] = f"{options.get('collection', 'rag-chunks')}-tombstone-canary"
    elif backend == "pgvector":
        out["table"] = f"{options['table']}_tombstone_canary"
    elif backend == "pinecone":
        out["namespace"] = "tombstone-canary"
    elif backend == "docstore":
        path = Path(options["path"])
        out["path"] = str(path.with_name(f"{path.stem}-tombstone-canary{path.suffix}"))
    elif backend == "faiss":
        out["path"] = f"{options['path'].rstrip('/')}-tombstone-canary"
    return out


def run_check(backend: str, *, config_path: str | None = None, canaries: int = 3,
              workdir: str | Path | None = None) -> CheckResult:
    """Write, erase and judge canaries for ``backend``; see the module docstring."""
    from tombstone import demo

    if backend not in CHECK_BACKENDS:
        raise ConfigError(f"tombstone check knows backends {', '.join(CHECK_BACKENDS)}; got {backend!r}")
    capabilities = adapter_class(backend).capabilities
    managed = Capability.MANAGED in capabilities
    result = CheckResult(backend)
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="tombstone-check-"))
    try:
        if config_path:
            config = load_config(config_path)
            mine = [s for s in config.stores.values() if s.backend == backend]
            if not mine:
                raise ConfigError(f"{config.path} configures no {backend} store")
            options = {"backend": backend, **_canary_options(backend, mine[0].options)}
            result.notes.append(f"canaries in the configured {backend} store, in their own place: "
                                f"{ {k: v for k, v in options.items() if k in ('collection', 'table', 'namespace', 'path')} }")
        elif backend == "pinecone":
            options = demo.start_pinecone_emulator()
            result.notes.append("no config given: pinecone ran against the local emulator of its data-plane API")
        else:
            options = dict(demo.STORES[backend][0])
        deployment = init_deployment(root / "deployment", {backend: {k: v for k, v in options.items() if v is not None}})
        subjects = [f"{CANARY_PREFIX}{i:04d}" for i in range(1, canaries + 1)]
        with Tombstone(deployment) as tomb:
            demo.fill(tomb, backend, subjects)
            arts = [a for s in subjects for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(s))]
            if Capability.PHYSICAL_SCAN in capabilities:
                before = tomb.adapter(backend).probe_physical(arts)
                blind = [a.artifact_id for a in arts if not before[a.artifact_id].id_found]
                if blind:
                    result.failures.append(f"control failed: the physical probe did not find live canaries {blind}")
            expected = "UNVERIFIED(managed) with a passing logical probe" if managed else "VERIFIED(physical)"
            for subject in subjects:
                receipt, _ = tomb.erase(subject)
                for entry in receipt["artifacts"]:
                    logical = entry["evidence"]["probes"][0]
                    if managed:
                        ok = (entry["status"] == "UNVERIFIED" and "managed" in (entry["reason"] or "")
                              and logical["passed"] is True)
                    else:
                        ok = entry["status"] == "VERIFIED" and entry["level"] == "physical"
                    detail = entry["level"] or entry["reason"] or ""
                    if entry["measurement"]:
                        detail += f": {entry['measurement']}"
                    result.rows.append(CheckRow(entry["artifact_id"], subject, f"{entry['status']}({detail})",
                                                expected, ok, detail))
    finally:
        for line in demo.stop_services():
            result.notes.append(line)
        if not workdir:
            shutil.rmtree(root, ignore_errors=True)
    return result
