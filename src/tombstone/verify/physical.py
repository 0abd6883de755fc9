"""The physical level: are the artifact's bytes still anywhere in the store's files?

Everything the physical probe does lives here, for every backend: the byte patterns of an artifact, one
scan of every persisted file for all patterns of a batch, attribution of each hit to the artifact it
belongs to, an adapter's extra checks (places a byte scan cannot see, such as planner statistics), and
the duplicate-content decision (the id is gone but a live artifact of another subject owns the same
content, so the remaining bytes are that survivor's).

An adapter contributes through hooks on :class:`tombstone.contract.Adapter`:

* ``physical_snapshot()`` — a context manager yielding ``{path: label}`` of every file holding the
  store's bytes (by default ``physical_files()``, labelled by file name); a server-backed store copies
  its relation files to a temporary folder here;
* ``physical_patterns(artifact)`` — the patterns; keys starting ``id`` are the artifact id in each form
  the store writes it, keys starting ``content`` its fingerprint in each encoding;
* ``physical_extra(artifacts)`` — :class:`ExtraFinding` per artifact for what the scan cannot see.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tombstone.capabilities import Capability
from tombstone.errors import PhysicalUnsupportedError
from tombstone.lineage.records import ArtifactRecord, fingerprint_bytes
from tombstone.verify.levels import Level
from tombstone.verify.result import ProbeResult
from tombstone.verify import scanner
from tombstone.verify.scanner import scan_files

if TYPE_CHECKING:
    from tombstone.verify.runner import VerifyContext

LEVEL = Level.PHYSICAL
CAPABILITY = Capability.PHYSICAL_SCAN
MIN_NONZERO_FINGERPRINT_DIMS = 4


@dataclass(frozen=True)
class ExtraFinding:
    """What an adapter's own check found of one artifact outside the scanned files."""

    found: list[str] = field(default_factory=list)
    """One measurement per place the artifact was found (empty: found nowhere)."""
    id_found: bool = False
    """The artifact's id was among what was found."""
    content_found: bool = False
    """The artifact's content was among what was found."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """What the check looked at, for the receipt."""


def fingerprint_scannable(artifact: ArtifactRecord) -> bool:
    """Whether the fingerprint is distinctive enough to search for as bytes.

    A fingerprint that is mostly zeros (sparse embeddings of short texts) matches every run of zero
    bytes in a file; it is left out and the id alone decides. Never the other way round: leaving a
    pattern out can only lose a RESIDUAL that the id would still catch.
    """
    fp = artifact.fingerprint
    return fp is not None and sum(1 for x in fp if x != 0.0) >= MIN_NONZERO_FINGERPRINT_DIMS


def default_patterns(artifact: ArtifactRecord) -> dict[str, bytes]:
    """The id as UTF-8, and the fingerprint as float32 little-endian when it is distinctive."""
    patterns = {"id": artifact.artifact_id.encode("utf-8")}
    if fingerprint_scannable(artifact):
        patterns["content"] = fingerprint_bytes(artifact.fingerprint)
    return patterns


def store_root(files: Iterable[Any]) -> str | None:
    """The folder every listed file lies in (the store's folder): nothing is read outside it."""
    parents = [os.path.abspath(os.path.dirname(os.fspath(path))) for path in files]
    return os.path.commonpath(parents) if parents else None


def _patterns(adapter: Any, artifacts: Sequence[ArtifactRecord]) -> tuple[dict[str, dict[str, bytes]], dict[str, bytes]]:
    """Each artifact's patterns, and all of them keyed for the scan. Kept, per adapter (up to ``KEEP``), for the
    next call in this thread with the same adapter and the very same records (a reclaim that scans, then the
    verification's stages; in a batch over several stores, each store's from its reclaim to its verification),
    until that verification ends (:func:`prepared`): records are frozen, so the same objects give the same
    patterns."""
    memo = getattr(_last, "patterns", None)
    if memo is None:
        memo = _last.patterns = {}
    held = memo.get(id(adapter))
    if (held is not None and held[0] is adapter and len(held[1]) == len(artifacts)
            and all(a is b for a, b in zip(held[1], artifacts))):
        return held[2], held[3]
    per_artifact = {art.artifact_id: adapter.physical_patterns(art) for art in artifacts}
    patterns = {f"{kind}\x00{aid}": pattern for aid, pats in per_artifact.items() for kind, pattern in pats.items()}
    memo.pop(id(adapter), None)
    memo[id(adapter)] = (adapter, list(artifacts), per_artifact, patterns)
    while len(memo) > KEEP:
        memo.pop(next(iter(memo)))
    return per_artifact, patterns


KEEP = 8
"""How many adapters' patterns a thread keeps at once (as many as the scanner keeps matchers)."""
_last = threading.local()


def prepared(adapter: Any, artifacts: Sequence[ArtifactRecord]) -> contextlib.AbstractContextManager[None]:
    """For the duration of the block (one verification's stages): the physical probe's patterns computed now,
    and its matcher built on a thread of its own while the levels below run (``scanner.prepare``), for a
    :func:`probe` of the same adapter and artifacts inside the block. Anything that fails here is left for the
    probe to meet and report."""

    @contextlib.contextmanager
    def block():
        global _open_blocks
        with _blocks_lock:
            _open_blocks += 1
        try:
            try:
                if adapter.has(CAPABILITY):
                    scanner.prepare(_patterns(adapter, artifacts)[1])
            except Exception:
                pass
            yield
        finally:
            with _blocks_lock:
                _open_blocks -= 1
                last = _open_blocks == 0
            # Nothing of the artifacts (their ids, their fingerprints' bytes) is kept past their verification.
            # Blocks nest (a batch prepares a store from its reclaim on, and its verification prepares it
            # again): the matchers go when the outermost one ends.
            memo = getattr(_last, "patterns", None)
            if memo:
                memo.pop(id(adapter), None)
            if last:
                _last.patterns = None
                scanner.forget()

    return block()


_open_blocks = 0
_blocks_lock = threading.Lock()


def probe(adapter: Any, artifacts: Sequence[ArtifactRecord]) -> dict[str, ProbeResult]:
    """Scan every file of ``adapter``'s store once for all patterns of all ``artifacts``.

    Raises PhysicalUnsupportedError when the store cannot be checked; never reports an absence it
    did not observe.
    """
    if not adapter.has(CAPABILITY):
        raise PhysicalUnsupportedError(STAGE.unsupported(adapter), store=adapter.store)
    per_artifact, patterns = _patterns(adapter, artifacts)
    with adapter.physical_snapshot() as files:
        labels = {str(path): label for path, label in files.items()}
        report = scan_files(list(files), patterns, root=store_root(files))
    extra = adapter.physical_extra(artifacts)
    results = {}
    for art in artifacts:
        kinds = per_artifact[art.artifact_id]
        id_hits = [hit for kind in kinds if kind.startswith("id") for hit in report.found(f"{kind}\x00{art.artifact_id}")]
        content_hits = [hit for kind in kinds if kind.startswith("content")
                        for hit in report.found(f"{kind}\x00{art.artifact_id}")]
        more = extra.get(art.artifact_id, ExtraFinding())
        found = []
        if id_hits:
            found.append(f"id found {len(id_hits)}x in {_where(id_hits, labels)}")
        if content_hits:
            found.append(f"content found {len(content_hits)}x in {_where(content_hits, labels)}")
        found += more.found
        results[art.artifact_id] = ProbeResult(
            level=LEVEL,
            passed=not found,
            measurement="; ".join(found) or None,
            evidence={
                "files_scanned": sorted(labels[f] for f in report.files),
                "bytes_scanned": report.bytes_scanned,
                "patterns": sorted(kinds),
                "id_hits": len(id_hits),
                "content_hits": len(content_hits),
                **more.evidence,
            },
            id_found=bool(id_hits) or more.id_found,
            content_found=bool(content_hits) or more.content_found,
        )
    return results


def _where(hits, labels: dict[str, str]) -> str:
    return ", ".join(sorted({labels.get(h.file, h.file) for h in hits}))


def attribute(result: ProbeResult, sharing: Sequence[ArtifactRecord]) -> tuple[ProbeResult, str | None]:
    """The duplicate-content decision: the result the lattice decides on, and why content was excused.

    When the id is gone but live artifacts of other subjects hold the same content, whatever content
    bytes remain are theirs (no scan can tell identical bytes apart, and a store may re-encode them), and
    those survivors must not be deleted: the physical probe counts as passed and the artifact is
    UNVERIFIED(duplicate content). Decided on the lineage graph, which a resume does not change.
    """
    if result.id_found or not sharing:
        return result, None
    why = (f"{len(sharing)} live artifact(s) of other subjects hold the same content"
           f"{' (bytes found)' if result.content_found else ''}")
    return dataclasses.replace(result, passed=True, measurement=None), why


class PhysicalStage:
    """The physical level as a stage of the verification pipeline."""

    level = LEVEL
    capability = CAPABILITY

    def unsupported(self, adapter: Any) -> str:
        own = adapter.unsupported_reason(self.level)
        if own:
            return own
        if adapter.has(Capability.MANAGED):
            return f"managed: {adapter.backend} is a managed service with no access to its persisted bytes"
        return f"{adapter.backend} offers no access to its persisted bytes"

    prepared = staticmethod(prepared)

    def run(self, ctx: "VerifyContext", adapter: Any, artifacts: Sequence[ArtifactRecord]):
        from tombstone.verify.runner import StageOutput

        results = ctx.call(lambda: adapter.probe_physical(artifacts))
        out = StageOutput(outcomes=dict(results))
        sharing_of: Callable[[ArtifactRecord], Sequence[ArtifactRecord]] | None = ctx.live_sharing_content
        if ctx.live_sharing_content_many is not None:
            # one lookup for every artifact whose id is gone (the only ones the decision asks about)
            asked = [art for art in artifacts if (r := results.get(art.artifact_id)) is not None and not r.id_found]
            sharing = ctx.live_sharing_content_many(asked)
            sharing_of = lambda art: sharing[(art.store, art.artifact_id)]  # noqa: E731
        if sharing_of is not None:
            for art in artifacts:
                result = results.get(art.artifact_id)
                if result is None:
                    continue
                decided, why = attribute(result, sharing_of(art) if not result.id_found else ())
                if why:
                    out.decided[art.artifact_id] = decided
                    out.findings[art.artifact_id] = {"duplicate_content": why}
        return out


STAGE = PhysicalStage()

__all__ = ["ExtraFinding", "STAGE", "attribute", "default_patterns", "fingerprint_scannable", "prepared", "probe"]
