"""The physical level: are the artifact's bytes still anywhere in the store's files?

Everything the physical probe does lives here, for every backend: the byte patterns of an artifact, one
scan of every persisted file for all patterns of a batch, attribution of each hit to the artifact it
belongs to, an adapter's extra checks (places a byte scan cannot see, such as planner statistics), and
the duplicate-content decision (the id is gone but a live artifact of another subject owns the same
content, so the remaining bytes are that survivor's).

An adapter contributes through hooks on :class:`tombstone.contract.Adapter`:

* ``physical_snapshot()`` — a context manager yielding ``{path: label}`` of every file holding the
  store's bytes (by default ``physical_files()``, labelled by file name);
* ``physical_streams()`` (None by default) — for a store whose bytes a server hands out rather than files
  this process can open, a context manager yielding :class:`tombstone.verify.scanner.Stream` s (each relation
  file, read in parts through SQL and scanned as the parts arrive, nothing written to disk), used instead of
  the snapshot;
* ``physical_patterns(artifact)`` — the patterns; keys starting ``id`` are the artifact id in each form
  the store writes it, keys starting ``content`` its fingerprint in each encoding;
* ``physical_extra(artifacts)`` — :class:`ExtraFinding` per artifact for what the scan cannot see;
* ``physical_root()`` (optional) — the store's own directory. Every regular file under it that the snapshot
  does not list (a ``chroma.sqlite3.bak``, a ``docstore.db`` copied into a sub-folder) is read too, as bytes
  for the same patterns, and named in the probe's evidence (``other_files_scanned``): a hit in one is a hit
  like any other, named "not one of the store's files". What a Tombstone deployment keeps there is left out
  (:func:`deployment_owned`): its lineage db, locks, keys, receipts and the other stores it configures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tombstone.capabilities import Capability
from tombstone.errors import PhysicalUnsupportedError
from tombstone.lineage.records import ArtifactRecord, fingerprint_bytes
from tombstone.verify.levels import Level
from tombstone.verify.result import NotRun, Outcome, ProbeResult
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
    unchecked: str | None = None
    """Why the check could not look everywhere the artifact may be (a file it cannot read): an artifact
    found nowhere is then not probed (``NotRun``: UNVERIFIED, naming why), never passed."""


def fingerprint_scannable(artifact: ArtifactRecord) -> bool:
    """Whether the fingerprint is distinctive enough to search for as bytes.

    A fingerprint that is mostly zeros (sparse embeddings of short texts) matches every run of zero
    bytes in a file; it is left out and the id alone decides. Never the other way round: leaving a
    pattern out can only lose a RESIDUAL that the id would still catch.
    """
    fp = artifact.fingerprint
    if fp is None:
        return False
    zeros = fp.count(0.0) if isinstance(fp, (tuple, list)) else sum(1 for x in fp if x == 0.0)
    return len(fp) - zeros >= MIN_NONZERO_FINGERPRINT_DIMS


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


CONFIG_NAME = "tombstone.toml"
_SIDECARS = ("-wal", "-shm", "-journal", ".tombstone.lock")
"""What lies beside a SQLite file or a store path and belongs to it."""


def _configs_near(root: str, found_below: Iterable[str]) -> list[str]:
    """The deployment configs that may name paths under ``root``: one in ``root`` or any folder above it,
    any found below it, and the one ``$TOMBSTONE_CONFIG`` names."""
    near = []
    folder = root
    while True:
        near.append(os.path.join(folder, CONFIG_NAME))
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    env = os.environ.get("TOMBSTONE_CONFIG")
    if env:
        near.append(os.path.abspath(env))
    return list(dict.fromkeys([*near, *found_below]))


def deployment_owned(root: str, known: Iterable[str], configs: Iterable[str]) -> dict[str, str]:
    """The paths under ``root`` that a Tombstone deployment keeps for itself, each with why, for the configs
    in ``configs`` that load: its lineage db (and its side files, its ``locks/`` folder), its keys and
    receipts folders, the auditor keys it lists, and every path of a store it configures (with that store's
    side files and lock). A store path that is one of ``known`` (the probed store's own) or that holds
    ``root`` is not left out. A config that does not load leaves nothing out."""
    from tombstone.config import load_config
    from tombstone.errors import ConfigError

    known = {os.path.abspath(k) for k in known}
    owned: dict[str, str] = {}

    def own(path: Any, why: str, sidecars: bool = False) -> None:
        path = os.path.abspath(os.fspath(path))
        if path in known or not _under(path, root) or path == root:
            return
        owned[path] = why
        if sidecars:
            for suffix in _SIDECARS:
                owned.setdefault(path + suffix, why)

    for config_path in configs:
        if not os.path.isfile(config_path):
            continue
        try:
            config = load_config(config_path)
        except (ConfigError, OSError, ValueError):
            continue
        name = os.path.basename(config_path)
        if config.lineage_dsn is None:
            own(config.lineage_db, f"the lineage db of {name}", sidecars=True)
            own(os.path.join(os.path.dirname(config.lineage_db), "locks"), f"the lineage locks of {name}")
        own(config.keys_dir, f"the keys of {name}")
        own(config.receipts_dir, f"the receipts of {name}")
        for key in config.auditor_keys:
            own(key, f"an auditor key of {name}")
        for store in config.stores.values():
            for option, value in store.options.items():
                if isinstance(value, str) and (option == "path" or option.endswith(("_path", "_dir"))):
                    if os.path.abspath(value) in known or _under(root, os.path.abspath(value)):
                        continue  # the probed store itself
                    own(value, f"store {store.name} of {name}", sidecars=True)
    return owned


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def other_files(root: str | os.PathLike[str], known: Iterable[str | os.PathLike[str]]) -> tuple[list[Path], list[str]]:
    """Every regular file under ``root`` (sub-folders included, links to folders not followed) that is not one
    of ``known`` nor kept there by a Tombstone deployment (:func:`deployment_owned`); and a line for each entry
    left unread, with why: the deployment's, a symbolic link (its target, if inside, is read where it lies), or
    something that is not a regular file and holds no stored bytes (a FIFO, a socket, a device). A folder that
    cannot be listed raises PhysicalUnsupportedError naming it: what is in it was not checked."""
    root = os.path.abspath(os.fspath(root))
    known_paths = [os.path.abspath(os.fspath(k)) for k in known]
    entries: list[tuple[str, str]] = []  # (path, "file" | "link" | "other")
    configs_below: list[str] = []
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as listing:
                found = list(listing)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise PhysicalUnsupportedError(f"cannot list {folder}: {exc.strerror or exc}; its files were not scanned")
        for entry in found:
            path = os.path.abspath(entry.path)
            try:
                if entry.is_symlink():
                    entries.append((path, "link"))
                elif entry.is_dir(follow_symlinks=False):
                    stack.append(path)
                elif entry.is_file(follow_symlinks=False):
                    entries.append((path, "file"))
                    if entry.name == CONFIG_NAME:
                        configs_below.append(path)
                else:
                    entries.append((path, "other"))
            except OSError:
                entries.append((path, "other"))
    owned = deployment_owned(root, known_paths, _configs_near(root, configs_below))
    known_set = set(known_paths)
    files: list[Path] = []
    skipped: list[str] = []
    left_out: dict[str, str] = {}
    for path, kind in sorted(entries):
        if path in known_set:
            continue
        label = os.path.relpath(path, root)
        holder = next((o for o in owned if _under(path, o)), None)
        if holder is not None:  # named once: the folder, or the file
            left_out[os.path.relpath(holder, root) + ("" if holder == path else os.sep)] = owned[holder]
        elif kind == "link":
            skipped.append(f"{label}: a symbolic link, not followed")
        elif kind == "other":
            skipped.append(f"{label}: not a regular file")
        else:
            files.append(Path(path))
    skipped = [f"{label}: {why}" for label, why in sorted(left_out.items())] + skipped
    return files, skipped


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


def keyed_patterns(adapter: Any, artifacts: Sequence[ArtifactRecord]) -> dict[str, bytes]:
    """Every pattern of ``artifacts``, keyed ``"<kind>\\x00<artifact id>"`` as the probe scans for them: for an
    adapter's reclaim that scans its files for what is left, computed once with the probe's (the same records
    inside a batch's :func:`prepared` block give the same patterns)."""
    return _patterns(adapter, artifacts)[1]


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


def probe(adapter: Any, artifacts: Sequence[ArtifactRecord]) -> dict[str, Outcome]:
    """Scan every file of ``adapter``'s store once for all patterns of all ``artifacts``.

    Raises PhysicalUnsupportedError when the store cannot be checked; never reports an absence it
    did not observe (an artifact found nowhere while the adapter's own check could not look everywhere,
    ``ExtraFinding.unchecked``, is ``NotRun``).
    """
    if not adapter.has(CAPABILITY):
        raise PhysicalUnsupportedError(STAGE.unsupported(adapter), store=adapter.store)
    per_artifact, patterns = _patterns(adapter, artifacts)
    own_root = getattr(adapter, "physical_root", None)
    directory = None
    others: dict[str, str] = {}
    skipped: list[str] = []
    streams = adapter.physical_streams()
    if streams is not None:  # bytes a server hands out (no local files): scanned as they arrive
        with streams as parts:
            report = scanner.scan_streams(parts, patterns)
        labels = {name: name for name in report.files}
    else:
        with adapter.physical_snapshot() as files:
            labels = {str(path): label for path, label in files.items()}
            directory = own_root() if own_root is not None else None
            if directory is not None:
                found, skipped = other_files(directory, files)
                others = {str(path): os.path.relpath(path, directory) for path in found}
                labels.update(others)
            every = [*files, *map(Path, others)]
            report = scan_files(every, patterns, root=store_root(every))
    extra = adapter.physical_extra(artifacts)
    read_others = sorted(others[f] for f in report.files if f in others)
    other_evidence: dict[str, Any] = {}
    if directory is not None:
        other_evidence["other_files_scanned"] = _capped(read_others)
        if skipped:
            other_evidence["not_scanned"] = _capped(skipped)
    # What every artifact's evidence shares is made once (one list, not one per artifact of a batch).
    scanned = {"files_scanned": sorted(labels[f] for f in report.files if f not in others),
               "bytes_scanned": report.bytes_scanned}
    hits = report.hits
    no_extra = ExtraFinding()
    results = {}
    for art in artifacts:
        aid = art.artifact_id
        kinds = per_artifact[aid]
        id_hits = [hit for kind in kinds if kind.startswith("id") for hit in hits.get(f"{kind}\x00{aid}", ())]
        content_hits = [hit for kind in kinds if kind.startswith("content") for hit in hits.get(f"{kind}\x00{aid}", ())]
        more = extra.get(aid, no_extra)
        found = []
        if id_hits:
            found.append(f"id found {len(id_hits)}x in {_where(id_hits, labels, others)}")
        if content_hits:
            found.append(f"content found {len(content_hits)}x in {_where(content_hits, labels, others)}")
        found += more.found
        every = id_hits + content_hits
        stray = [h for h in every if h.file in others] if every and others else []
        evidence = {
            **scanned,
            "patterns": sorted(kinds),
            "id_hits": len(id_hits),
            "content_hits": len(content_hits),
            "store_file_hits": len(every) - len(stray),
            **other_evidence,
            **({"found_in_other_files": sorted({others[h.file] for h in stray})} if stray else {}),
            **more.evidence,
        }
        if not found and more.unchecked:
            results[art.artifact_id] = NotRun(LEVEL, more.unchecked, evidence=evidence)
            continue
        if found and more.unchecked:  # found, and why erasing again may not be enough yet (a stale client)
            found.append(more.unchecked)
        results[art.artifact_id] = ProbeResult(level=LEVEL, passed=not found, measurement="; ".join(found) or None,
                                               evidence=evidence, id_found=bool(id_hits) or more.id_found,
                                               content_found=bool(content_hits) or more.content_found)
    return results


NAMED_AT_MOST = 50
"""How many other files (read, or left unread) a probe's evidence names, per artifact; the rest are counted."""


def _capped(names: list[str]) -> list[str]:
    if len(names) <= NAMED_AT_MOST:
        return names
    return names[:NAMED_AT_MOST] + [f"... and {len(names) - NAMED_AT_MOST} more"]


def _where(hits, labels: dict[str, str], others: dict[str, str]) -> str:
    own = sorted({labels.get(h.file, h.file) for h in hits if h.file not in others})
    stray = sorted({others[h.file] for h in hits if h.file in others})
    named = own + ([f"{', '.join(stray)} (not one of the store's files)"] if stray else [])
    return ", ".join(named)


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
            asked = [art for art in artifacts if (r := results.get(art.artifact_id)) is not None and r.ran
                     and not r.id_found]
            sharing = ctx.live_sharing_content_many(asked)
            sharing_of = lambda art: sharing[(art.store, art.artifact_id)]  # noqa: E731
        if sharing_of is not None:
            for art in artifacts:
                result = results.get(art.artifact_id)
                if result is None or not result.ran:  # not probed (NotRun): nothing to attribute
                    continue
                decided, why = attribute(result, sharing_of(art) if not result.id_found else ())
                if why:
                    out.decided[art.artifact_id] = decided
                    out.findings[art.artifact_id] = {"duplicate_content": why}
        return out


STAGE = PhysicalStage()

__all__ = ["ExtraFinding", "STAGE", "attribute", "default_patterns", "deployment_owned", "fingerprint_scannable",
           "other_files", "prepared", "probe"]
