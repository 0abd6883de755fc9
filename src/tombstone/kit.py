"""What an adapter's demo hooks are handed: the demo data and the deployment being built.

The adapter contract's ``demo_store`` and ``demo_fill`` take a :class:`Kit`. It is declared here, below the
contract, as a protocol that imports nothing of Tombstone's: the contract names it without reaching the
demo, the API or anything else above it. ``tombstone.demo.DemoKit`` is the one implementation; an adapter
uses nothing of a kit but what is listed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class Kit(Protocol):
    """The deterministic demo data, and the deployment that hooks fill."""

    root: Path
    """The deployment directory (store paths in ``demo_store`` are relative to it)."""
    tomb: Any
    """The open deployment (``tombstone.Tombstone``) while stores are filled; None before."""
    embedding_dim: int
    """Dimension of the demo's embeddings."""
    collection: str
    """Default collection (or table, index) name for chunk stores."""
    llm: str
    """The LLM string cached answers are keyed by."""
    services: list[Any]
    """Where a hook registers what it starts (``tombstone.demo.Service``: a stop callable and a note)."""
    semantic: bool
    """Whether the demo's vector stores are embedded with MiniLM (and the semantic level enabled)."""

    @property
    def lineage(self) -> Any:
        """The open deployment's lineage db."""

    def embedder(self) -> Any:
        """The offline embedder every demo store uses."""

    def account(self, subject: str) -> str:
        """The subject's account number (in each of its notes once)."""

    def documents(self, subject: str) -> list[tuple[str, str, dict]]:
        """The subject's documents: (id, text, metadata)."""

    def chunks(self, subject: str) -> tuple[list[str], list[str], list[dict]]:
        """The chunks cut from the subject's documents: ids, texts, metadata."""

    def answer(self, subject: str) -> tuple[str, list, list[str]]:
        """A question about the subject, the (simulated) LLM's answer, and the chunk ids it quotes."""

    def store_with_role(self, role: str) -> tuple[str, dict[str, Any]] | None:
        """The first store whose backend builds ``role`` data: its name and options; None when none does."""

    def stores_with_role(self, role: str) -> list[str]:
        """The deployment's stores whose backend builds ``role`` data, by name."""

    def document_sources(self, chunk_ids: Sequence[str]) -> list[tuple[str, str, str]]:
        """Lineage edges from a document store to chunks cut from it: (store, document id, relation)."""

    def chunk_sources(self, chunk_ids: Sequence[str]) -> list[tuple[str, str]]:
        """What data derived from chunks was made from."""

    def answer_sources(self, chunk_ids: Sequence[str]) -> list[tuple[str, str]]:
        """What an answer was built from."""


__all__ = ["Kit"]
