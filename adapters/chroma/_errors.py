"""Chroma's exceptions, mapped to Tombstone's in the app-facing wrapper (the adapter's are mapped by
``Adapter.map_vendor_error``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tombstone.errors import StoreUnavailableError


@contextlib.contextmanager
def mapped(store: str) -> Iterator[None]:
    import chromadb.errors

    try:
        yield
    except chromadb.errors.ChromaError as exc:
        raise StoreUnavailableError(f"chroma: {exc}", store=store,
                                    retryable=not isinstance(exc, chromadb.errors.NotFoundError)) from exc
