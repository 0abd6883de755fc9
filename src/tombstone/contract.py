"""The adapter contract: what every backend implements, and how backends are found.

An adapter serves one configured store. It declares its capabilities; the saga, the verify stages and
the lattice read those declarations and never guess from which methods a class overrides. Built-in
adapters register through the ``tombstone.adapters`` entry-point group exactly as a third-party package
would, naming in brackets the extra that installs their client (for the install hint)::

    [project.entry-points."tombstone.adapters"]
    mystore = "my_package.adapter:MyStoreAdapter [mystore]"

The core never names a backend: everything it does per backend — demo data, canary placement for
``tombstone check``, reading survivors for the crash harness, mapping the vendor's exceptions — is a hook
on :class:`Adapter` that the backend's own package implements.
"""

from __future__ import annotations

import abc
import contextlib
import difflib
import functools
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tombstone.capabilities import Capability
from tombstone.errors import (
    AdapterError,
    AdapterNotFoundError,
    ConfigError,
    PhysicalUnsupportedError,
    StoreUnavailableError,
    TombstoneError,
)
from tombstone.lineage.records import ArtifactRecord
from tombstone.storelock import STORE_LOCK_WAIT, StoreLock, lock_file_for
from tombstone.verify import physical
from tombstone.verify.levels import Level
from tombstone.verify.neighbourhood import Neighbours
from tombstone.verify.physical import ExtraFinding
from tombstone.verify.result import NotRun, ProbeResult

if TYPE_CHECKING:
    from tombstone.kit import Kit
    from tombstone.scanreport import ScanReport

ENTRY_POINT_GROUP = "tombstone.adapters"
DISTRIBUTION = "tombstone-rag"
# The operations whose vendor exceptions the base class maps to StoreUnavailableError at one point.
MAPPED_OPERATIONS = ("__init__", "suppress", "reclaim", "probe_logical", "probe_physical", "native_delete",
                     "physical_files", "physical_extra", "semantic_neighbours", "stored_vectors",
                     "model_material", "model_target")
WRITING_OPERATIONS = ("suppress", "reclaim", "native_delete")
"""The operations a read-only adapter refuses."""
READ_ONLY = "read_only"
"""The option :meth:`Adapter.open_read_only` sets: the adapter must not change a byte of the store."""


def _mapped(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except TombstoneError:
            raise
        except Exception as exc:
            if not isinstance(exc, self.vendor_errors()):
                raise
            raise self.map_vendor_error(exc) from exc

    wrapper.__tombstone_mapped__ = True
    return wrapper


def _refused_when_read_only(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if getattr(self, "read_only", False):
            raise AdapterError(f"store {self.store!r} was opened read-only: {method.__name__} refused",
                               store=self.store)
        return method(self, *args, **kwargs)

    wrapper.__tombstone_guarded__ = True
    return wrapper


class Adapter(abc.ABC):
    """Base class of every backend adapter. One instance serves one configured store.

    Subclasses set ``backend`` and ``capabilities`` and implement the abstract methods. Every method
    takes the artifacts to act on; none may touch an artifact it was not given (survivors are never
    deleted). Exceptions of the vendor's client (``vendor_errors()``) raised by any operation are turned
    into StoreUnavailableError here, so only TombstoneErrors leave an adapter.
    """

    backend: ClassVar[str]
    """The name users write in ``backend = "..."``."""
    capabilities: ClassVar[frozenset[Capability]]
    """Declared capabilities; the lattice and the saga read them."""
    levels: ClassVar[tuple[Level, ...]] = (Level.LOGICAL, Level.PHYSICAL)
    """Levels this backend can be verified at, lowest first."""
    demo_role: ClassVar[str | None] = None
    """What ``tombstone demo`` builds in a store of this backend: ``documents``, ``chunks`` (cut from the
    documents), ``examples`` (training examples exported from the chunks), ``model`` (weights trained on the
    examples) or ``answers`` (LLM answers built from the chunks); None: the backend has no demo."""
    demo_needs: ClassVar[tuple[str, ...]] = ()
    """Roles this backend's demo data is built from and cannot do without (``model``: ``examples``). When
    none of the backends asked for builds one, ``tombstone demo`` adds a backend that does, and says so."""
    demo_default: ClassVar[bool] = False
    """Whether a plain ``tombstone demo`` builds this backend."""
    experimental: ClassVar[bool] = False
    """A backend whose engine, or Tombstone's knowledge of where it keeps deleted data, is new: ``tombstone
    backends`` marks it, and its docs say what is not yet checked."""
    for_tests: ClassVar[bool] = False
    """An adapter that exists for tests (a fault injector): ``tombstone backends`` lists it only with ``--all``."""
    read_only_supported: ClassVar[bool] = False
    """Whether the adapter honours read-only mode (:meth:`open_read_only`, the ``read_only`` option): it
    then opens and probes the store without changing a byte of it — no write, no recovery of an interrupted
    rewrite, no resumption of a reclaim phase, no maintenance command — and ``suppress``, ``reclaim`` and
    ``native_delete`` refuse. The auditor opens a store only through an adapter that declares this."""

    @classmethod
    def preflight(cls, store: str, options: Mapping[str, Any]) -> bool:
        """Check, before an erasure changes anything, that the store opens with these options, without
        changing a byte of it; return whether this process may write every file the store keeps bytes in.
        TombstoneError (one line) when it does not open. The default opens it read-only
        (:meth:`open_read_only`) and closes it again; a backend whose read-only open is costly (a private
        copy of the store) overrides this with a check that reads less."""
        adapter = cls.open_read_only(store, options)
        try:
            try:
                return writable_files(adapter.physical_files())
            except PhysicalUnsupportedError:
                return True
        finally:
            adapter.close()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in MAPPED_OPERATIONS:
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "__tombstone_mapped__", False):
                setattr(cls, name, _mapped(method))
        for name in WRITING_OPERATIONS:
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "__tombstone_guarded__", False):
                setattr(cls, name, _refused_when_read_only(method))

    def __init__(self, store: str, options: Mapping[str, Any]) -> None:
        self.store = store
        self.options = dict(options)
        self.read_only = bool(self.options.get(READ_ONLY, False))
        """Opened by :meth:`open_read_only`: nothing may change the store."""
        self.content_key: Callable[[str], str] | None = None
        """Turns a SHA-256 hex digest of content into the keyed form the lineage db records
        (``ArtifactRecord.content_hash``); set by the deployment, None for an independent verifier."""

    @classmethod
    def open_read_only(cls, store: str, options: Mapping[str, Any]) -> "Adapter":
        """Open the store without changing it (what the auditor does); AdapterError if the adapter has no
        read-only mode (``read_only_supported``)."""
        if not cls.read_only_supported:
            raise AdapterError(f"the {cls.backend} adapter has no read-only mode, so the auditor does not open"
                               f" store {store!r}", store=store)
        return cls(store, {**options, READ_ONLY: True})

    @classmethod
    def credential_destination(cls, store: str, options: Mapping[str, Any]) -> str | None:
        """What credential of the caller's opening this store would send, and to which host the options name
        (``"the API key in $PINECONE_API_KEY to https://..."``); None when it sends none (local files, an
        embedded server). The auditor probes such a store only when told to trust the configuration."""
        return None

    # -- errors -------------------------------------------------------------------------------

    def vendor_errors(self) -> tuple[type[BaseException], ...]:
        """The exception types of the vendor's client (imported lazily); mapped to StoreUnavailableError."""
        return ()

    def map_vendor_error(self, exc: BaseException) -> TombstoneError:
        """The TombstoneError a vendor exception becomes (override to mark some not retryable)."""
        first = (str(exc).strip().splitlines() or [""])[0]
        return StoreUnavailableError(f"{self.backend}: {type(exc).__name__}: {first}".rstrip(": "), store=self.store)

    def require(self, *keys: str) -> None:
        """Raise one ConfigError line naming the options this backend needs, if any of ``keys`` is missing."""
        if any(key not in self.options for key in keys):
            needs = " and ".join(f'{key} = "..."' for key in keys)
            raise ConfigError(f"store {self.store!r}: the {self.backend} backend needs {needs}")

    RECLAIM_MODES = ("in-place", "rewrite")

    def reclaim_mode(self) -> str:
        """The ``reclaim`` option of a backend that has both recipes: ``in-place`` (the default) or
        ``rewrite``; anything else is one ConfigError line (a misspelt value never picks a recipe silently)."""
        mode = self.options.get("reclaim", "in-place")
        if mode not in self.RECLAIM_MODES:
            raise ConfigError(f"store {self.store!r}: reclaim = {mode!r} is not one of "
                              + ", ".join(f'"{m}"' for m in self.RECLAIM_MODES))
        return str(mode)

    def has(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def unsupported_reason(self, level: Level) -> str | None:
        """Why this store cannot be checked at ``level``, in the backend's own words (None: the stage's
        generic reason is enough). Asked only for levels whose capability the adapter does not declare."""
        return None

    # -- the erasure --------------------------------------------------------------------------

    @abc.abstractmethod
    def suppress(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        """Hide (or, for caches, delete) the artifacts on every query path. Idempotent. Returns evidence."""

    @abc.abstractmethod
    def reclaim(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, Any]:
        """Run the backend's physical recipe so the artifacts' bytes leave storage. Idempotent.

        Survivors must be unchanged afterwards. Returns evidence (steps run, settings in force).
        """

    def reclaim_store(self) -> dict[str, Any]:
        """The reclaim recipe over the whole store, for what is already deleted (by the store's own client,
        before any lineage): ``tombstone reclaim --store``. The caller holds the store lock. The default runs
        :meth:`reclaim` with no artifacts, which for a rewriting or vacuuming recipe reaches everything deleted;
        a backend whose reclaim works in place on named records overrides it. Returns evidence."""
        return self.reclaim([])

    def compact(self) -> dict[str, Any]:
        """Rewrite the store without the structural traces an in-place reclaim leaves (zeroed slots and their
        graph links, free pages); ``tombstone compact``. The caller holds the store lock. Returns evidence."""
        return {"mechanism": "none", "why": f"the {self.backend} reclaim leaves nothing to compact"}

    @abc.abstractmethod
    def probe_logical(
        self,
        artifacts: Sequence[ArtifactRecord],
        probe_vectors: Mapping[str, Sequence[Any]] | None = None,
    ) -> dict[str, ProbeResult]:
        """Ask every query path the wrapper knows whether it still returns each artifact.

        ``probe_vectors`` maps artifact ids to the fragment embeddings captured at write time
        (vector stores query with them; an independent verifier has none and passes ``None``).
        """

    @abc.abstractmethod
    def native_delete(self, artifacts: Sequence[ArtifactRecord]) -> None:
        """The store's own ordinary delete, with no reclaim. Used by controls in tests and checks."""

    # -- the physical probe (tombstone.verify.physical) ---------------------------------------

    def physical_files(self) -> list[Path]:
        """Every file in which the store persists bytes. Raises PhysicalUnsupportedError if none can be read."""
        raise PhysicalUnsupportedError(f"{self.backend} has no readable files", store=self.store)

    @contextlib.contextmanager
    def physical_snapshot(self) -> Iterator[dict[Path, str]]:
        """The files to scan, each with the label hits are reported under; valid inside the block."""
        yield {Path(path): Path(path).name for path in self.physical_files()}

    def physical_streams(self) -> contextlib.AbstractContextManager[Iterable[Any]] | None:
        """For a store whose bytes a server hands out (no file this process can open): a context manager
        yielding ``tombstone.verify.scanner.Stream`` s, each a named sequence of byte parts, scanned as they
        arrive instead of :meth:`physical_snapshot`'s files. None (the default): the snapshot's files are
        scanned."""
        return None

    def physical_patterns(self, artifact: ArtifactRecord) -> dict[str, bytes]:
        """Byte patterns whose presence means the artifact is still stored.

        Keys starting with ``id`` are the artifact id in each form the store writes it; keys starting
        with ``content`` (the fingerprint, in each encoding the store uses) are what byte-identical copies
        owned by other subjects would share, so their hits are attributed on the lineage graph.
        """
        return physical.default_patterns(artifact)

    fingerprint_scannable = staticmethod(physical.fingerprint_scannable)

    def physical_extra(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ExtraFinding]:
        """What the store keeps of the artifacts where a byte scan cannot see (e.g. planner statistics)."""
        return {}

    def probe_physical(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, ProbeResult]:
        """Byte-scan every persisted file once for all patterns of all artifacts (``verify.physical``).

        Raises PhysicalUnsupportedError when the backend cannot be checked; never reports absence it
        did not observe.
        """
        return physical.probe(self, artifacts)

    probe_physical = _mapped(probe_physical)

    # -- the semantic probe (tombstone.verify.semantic) ---------------------------------------

    def semantic_neighbours(self, vectors: Any, k: int, exclude: frozenset[str] = frozenset()) -> list[Neighbours]:
        """For each query vector (rows of ``vectors``), its ``k`` nearest records in the raw store (no
        suppression filter), those in ``exclude`` left out: ids in rank order, the store's own distances
        and the stored vectors. Needed by adapters that declare ``Capability.SEMANTIC_PROBE``."""
        raise NotImplementedError(f"the semantic probe is not implemented by the {self.backend} adapter (it declares"
                                  " SEMANTIC_PROBE but no semantic_neighbours)")

    def stored_vectors(self, ids: Sequence[str]) -> dict[str, Any]:
        """The stored vector of each id the raw store holds (ids it does not hold are left out)."""
        raise NotImplementedError(f"the semantic probe is not implemented by the {self.backend} adapter (it declares"
                                  " SEMANTIC_PROBE but no stored_vectors)")

    # -- the model probe (tombstone.verify.model) -----------------------------------------------

    def model_material(self, artifacts: Sequence[ArtifactRecord]) -> dict[str, dict[str, Any]]:
        """Before suppression, what the model probe needs of each artifact: ``kind`` (``trained``, ``holdout``
        or why not), the ``shards`` it was trained into and their ``weights`` SHA-256, its ``text``, its
        ``canary`` (``offset``, ``length``, ``alphabet``) when it holds one, and ``sharded``. Needed by
        adapters that declare ``Capability.MODEL_PROBE``."""
        raise NotImplementedError(f"the {self.backend} adapter has no model probe")

    def model_target(self) -> Any:
        """The model as it serves now, for the probe (``tombstone.verify.model.ModelTarget``)."""
        raise NotImplementedError(f"the {self.backend} adapter has no model probe")

    def close(self) -> None:
        """Release connections and handles."""

    # -- the store's lock (tombstone.storelock) -----------------------------------------------

    def lock_path(self) -> Path | None:
        """The store file or directory whose lock file (``<it>.tombstone.lock``, beside it) guards the
        store, for the default :meth:`store_lock`; None: no file lock."""
        return None

    def store_lock(self) -> contextlib.AbstractContextManager[Any]:
        """Held across processes while this store is changed or probed: the saga takes it around the
        store's suppress, reclaim and verify, and the backend's app-facing wrapper around each write, so a
        write acknowledged during a rewrite-based reclaim is never lost and a probe never reads a half
        rewritten store. Reentrant within a thread.

        The default is an exclusive ``flock`` on the lock file of :meth:`lock_path` (waiting at most the
        store option ``lock_wait``, default ``STORE_LOCK_WAIT`` seconds), or nothing when the adapter gives
        no path. An adapter whose store can be rewritten, or read half written, must give a path or
        override this method with the lock its store needs (a database's own lock, say); one whose store
        needs none should override it too, saying why.

        A read-only adapter takes no lock: taking one creates a lock file beside the store, and the auditor
        changes nothing (its snapshot copies are its own).
        """
        path = self.lock_path()
        if path is None or self.read_only:
            return contextlib.nullcontext()
        return StoreLock(lock_file_for(path), wait=float(self.options.get("lock_wait", STORE_LOCK_WAIT)),
                         store=self.store)

    # -- hooks for the demo, the CI gate and the crash harness --------------------------------

    @classmethod
    def demo_store(cls, kit: "Kit") -> dict[str, Any]:
        """Options (with ``backend``) for a store of this backend under ``stores/<backend>/`` of a demo or
        canary deployment; paths relative to the deployment root. May start a service (``kit.services``)."""
        raise ConfigError(f"the {cls.backend} adapter has no demo store")

    @classmethod
    def demo_fill(cls, kit: "Kit", store: str, options: Mapping[str, Any], subjects: Sequence[str]) -> None:
        """Write the subjects' demo data (``kit`` has their texts) through this backend's wrapper."""
        raise ConfigError(f"the {cls.backend} adapter cannot build demo data")

    @classmethod
    def canary_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """A configured store's options pointed at a place of the canaries' own (a collection, table,
        namespace or file beside the real one), for ``tombstone check --config``."""
        raise ConfigError(f"the {cls.backend} adapter cannot place canaries beside a configured store")

    @classmethod
    def discard_canary_place(cls, options: Mapping[str, Any]) -> None:
        """Remove the place :meth:`canary_options` gives a configured store's canaries (drop the collection,
        table or namespace; delete the file or folder, and its lock file), after ``tombstone check
        --config`` — whether the check passed, failed or broke off. ``options`` are the configured store's
        own; only the canaries' place is touched. Idempotent. An adapter that implements
        ``canary_options`` implements this too; the default removes nothing."""

    @classmethod
    def scan_deleted(cls, store: str, options: Mapping[str, Any]) -> "ScanReport":
        """``tombstone scan``: what the store itself marks deleted or unreachable but still holds, per place
        (``tombstone.scanreport.ScanReport``), with the ids it can recover and never content. Read-only: not a
        byte of the store may change (read a ``tombstone.fsutil.Snapshot`` copy of what the client writes
        to on opening). Adapters implement it in their package's ``forensics`` module."""
        raise NotImplementedError(f"the {cls.backend} adapter cannot scan for deleted data yet")

    @classmethod
    def read_survivors(cls, options: Mapping[str, Any]) -> Any:
        """Every live record of the store, read with the vendor's client rather than the adapter, in a
        form that compares equal when the stores hold the same records (the crash harness)."""
        raise NotImplementedError(f"the {cls.backend} adapter cannot read survivors")

    @classmethod
    def survivors_equal(cls, a: Any, b: Any) -> bool:
        """Whether two ``read_survivors`` results describe the same records."""
        return a == b

    @classmethod
    def after_copy(cls, options: Mapping[str, Any]) -> None:
        """Make a store usable after its deployment folder was copied (ownership, stale pid files)."""

    @classmethod
    def release(cls, options: Mapping[str, Any]) -> None:
        """Stop what this process started to serve the store (an embedded server), if anything."""


# -- the registry ---------------------------------------------------------------------------------


_registry: tuple[tuple[Any, ...], list[EntryPoint]] | None = None


def _entry_points() -> list[EntryPoint]:
    """The group's entry points, read once per import path: reading them walks every installed
    distribution's metadata (about 12 ms here), and an erasure opens several stores."""
    global _registry
    key = (entry_points, tuple(sys.path))
    if _registry is None or _registry[0] != key:
        _registry = (key, list(entry_points(group=ENTRY_POINT_GROUP)))
    return _registry[1]


def install_hint(backend: str) -> str:
    """How to install a backend's client, from the extra its entry point names (empty if none)."""
    for ep in _entry_points():
        if ep.name == backend and ep.extras:
            dist = ep.dist.name if ep.dist is not None else DISTRIBUTION
            return f"pip install '{dist}[{','.join(ep.extras)}]'"
    return ""


def adapter_class(backend: str) -> type[Adapter]:
    """Load the adapter class registered for ``backend`` in the entry-point group."""
    matches = [ep for ep in _entry_points() if ep.name == backend]
    if not matches:
        close = difflib.get_close_matches(backend, available_backends(), n=1)
        suggestion = f"; did you mean {close[0]!r}?" if close else ""
        raise AdapterNotFoundError(f"no adapter installed for backend {backend!r}{suggestion}")
    try:
        cls = matches[0].load()
    except ImportError as exc:
        hint = install_hint(backend)
        raise AdapterNotFoundError(f"the {backend!r} adapter cannot be imported ({exc})"
                                   f"{'; install it with: ' + hint if hint else ''}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Adapter)):
        raise AdapterError(f"entry point {backend!r} does not name an Adapter subclass")
    return cls


def available_backends() -> list[str]:
    """Every backend name registered in the entry-point group (installed or not importable)."""
    return sorted({ep.name for ep in _entry_points()})


def loadable_adapters() -> dict[str, type[Adapter] | AdapterNotFoundError]:
    """Every registered backend: its class, or why it cannot be loaded (with the install hint)."""
    out: dict[str, type[Adapter] | AdapterNotFoundError] = {}
    for name in available_backends():
        try:
            out[name] = adapter_class(name)
        except AdapterError as exc:
            out[name] = AdapterNotFoundError(str(exc))
    return out


def writable_files(paths: Sequence[str | Path]) -> bool:
    """Whether this process may write every one of ``paths`` that is a file, and their folders."""
    import os

    files = [Path(path) for path in paths]
    folders = {path.parent for path in files}
    return all(os.access(path, os.W_OK) for path in files if path.is_file() and not path.is_symlink()) \
        and all(os.access(folder, os.W_OK | os.X_OK) for folder in folders if folder.is_dir())


def open_adapter(store: str, backend: str, options: Mapping[str, Any]) -> Adapter:
    return adapter_class(backend)(store, options)


__all__ = ["Adapter", "Capability", "DISTRIBUTION", "ENTRY_POINT_GROUP", "ExtraFinding", "NotRun", "ProbeResult", "READ_ONLY",
           "adapter_class", "available_backends", "install_hint", "loadable_adapters", "open_adapter", "writable_files"]
