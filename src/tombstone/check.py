"""``tombstone check``: the CI gate for one backend's delete path.

Canary subjects — synthetic, named ``tombstone-canary-NNNN`` — are written through the backend's wrapper
by the adapter's own demo hook (``Adapter.demo_fill``) into a scratch store (``demo_store``; or, with a
config, into the configured store's server in a collection, table, directory or namespace of their own:
``canary_options``), erased, and each canary must end at the backend's highest applicable level: VERIFIED
at the highest level the adapter declares (physical for a self-hosted store); for a managed one,
UNVERIFIED(managed) with a passing logical probe. With a config, the canaries' place is removed afterwards
(``discard_canary_place``), whether the check passed or not. Any installed backend with those hooks can be
checked, the caches included. Before erasing, the physical probe must find every canary (the control): a
probe that cannot find live bytes proves nothing when it later finds none.

Canaries use a scratch lineage db and keys, so they never enter the operator's receipt chain.
"""

from __future__ import annotations

import shutil
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tombstone.api import Tombstone, init_deployment
from tombstone.capabilities import Capability
from tombstone.config import DEFAULT_LEVELS, load_config
from tombstone.contract import adapter_class
from tombstone.errors import ConfigError
from tombstone.receipt.model import ArtifactEntry, Receipt
from tombstone.verify.levels import Level, StatusKind

CANARY_PREFIX = "tombstone-canary-"


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
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode")


def checkable_backends() -> list[str]:
    """Every installed backend ``tombstone check`` can exercise: those whose adapter builds demo data."""
    from tombstone.demo import demo_backends

    return sorted(name for name, cls in demo_backends().items() if not cls.demo_needs)


def expectation(cls: type) -> tuple[str, Callable[[ArtifactEntry], bool]]:
    """What each canary of a backend must end with, as text and as a test of a receipt entry."""
    if Capability.MANAGED in cls.capabilities:
        def managed(entry: ArtifactEntry) -> bool:
            logical = entry.probe(Level.LOGICAL)
            return (entry.status is StatusKind.UNVERIFIED and "managed" in (entry.reason or "")
                    and logical is not None and logical.passed is True)

        return "UNVERIFIED(managed) with a passing logical probe", managed
    # The canaries' deployment runs the default levels: the semantic level is opt-in (and a few canaries are
    # too few to calibrate it), so the bar is the highest default level the backend can be verified at.
    top = max((lv for lv in cls.levels if lv in DEFAULT_LEVELS), key=lambda lv: lv.rank)
    return (f"VERIFIED({top.value})",
            lambda entry: entry.status is StatusKind.VERIFIED and entry.level is not None and entry.level.rank >= top.rank)


def run_check(backend: str, *, config_path: str | None = None, canaries: int = 3,
              workdir: str | Path | None = None, progress: Any = None) -> CheckResult:
    """Write, erase and judge canaries for ``backend``; see the module docstring. ``progress(step, store,
    done, total)`` is called after each step of each canary's erasure."""
    from tombstone.demo import DemoKit, demo_backends, fill, fill_order, stop_services

    cls = adapter_class(backend)
    if cls.demo_role is None:
        raise ConfigError(f"tombstone check needs a backend whose adapter can write canaries;"
                          f" {backend!r} cannot. Checkable: {', '.join(checkable_backends())}")
    if cls.demo_needs:
        raise ConfigError(f"tombstone check cannot write canaries into {backend!r}: they are built from"
                          f" {', '.join(cls.demo_needs)} it does not make; 'tombstone demo --backends {backend}'"
                          f" builds and erases them. Checkable: {', '.join(checkable_backends())}")
    result = CheckResult(backend)
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="tombstone-check-"))
    kit = DemoKit(root=root / "deployment")
    options: dict[str, Any] = {}
    configured: dict[str, Any] | None = None  # the configured store's options, when canaries go beside it
    try:
        if config_path:
            config = load_config(config_path)
            mine = [s for s in config.stores.values() if s.backend == backend]
            if not mine:
                raise ConfigError(f"{config.path} configures no {backend} store")
            configured = dict(mine[0].options)
            options = {"backend": backend, **cls.canary_options(configured)}
            place = {k: v for k, v in options.items() if k in ("collection", "table", "namespace", "path")}
            result.notes.append(f"canaries in the configured {backend} store, in their own place: {place}")
        else:
            options = cls.demo_store(kit)
        stores = {backend: {k: v for k, v in options.items() if v is not None}}
        # Derived stores (cached answers) need something to derive from, or every canary is a lineage gap:
        # a scratch store of the first installed backend that builds documents.
        sources = [name for name, c in demo_backends().items() if c.demo_role == "documents" and name != backend]
        if cls.demo_role == "answers" and sources:
            stores[sources[0]] = adapter_class(sources[0]).demo_store(kit)
            result.notes.append(f"the canaries' answers are derived from canary documents in a scratch {sources[0]} store")
        deployment = init_deployment(kit.root, stores)
        subjects = [f"{CANARY_PREFIX}{i:04d}" for i in range(1, canaries + 1)]
        with Tombstone(deployment) as tomb:
            for store in fill_order(tomb, list(stores)):
                fill(tomb, store, subjects, kit=kit)
            arts = [a for s in subjects for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key(s))
                    if a.store == backend]
            if Capability.PHYSICAL_SCAN in cls.capabilities:
                before = tomb.adapter(backend).probe_physical(arts)
                blind = [a.artifact_id for a in arts if not getattr(before[a.artifact_id], "id_found", False)]
                if blind:
                    result.failures.append(f"control failed: the physical probe did not find live canaries {blind}")
            expected, meets = expectation(cls)
            for subject in subjects:
                data, _ = tomb.erase(subject, progress=progress)
                for entry in Receipt.parse(data).artifacts:
                    if entry.store != backend:
                        continue
                    result.rows.append(CheckRow(entry.artifact_id, subject, entry.status_text, expected,
                                                meets(entry), entry.status_text))
    finally:
        if configured is not None:
            # The canaries' place goes too, passed or failed: nothing of the check stays in the user's store.
            try:
                cls.discard_canary_place(configured)
                result.notes.append("the canaries' place was removed from the configured store")
            except Exception as exc:
                result.failures.append(f"the canaries' place could not be removed from the configured store: {exc}")
        for line in stop_services():
            result.notes.append(line)
        cls.release(options)
        if not workdir:
            shutil.rmtree(root, ignore_errors=True)
    return result
