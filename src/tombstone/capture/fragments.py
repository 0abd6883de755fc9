"""Probe queries: the first, middle and last eight words of a chunk.

A logical probe needs a query that would find the chunk if it were still there; Tombstone never
keeps the content, so at write time it keeps the embeddings of these three short fragments, keyed
by the SHA-256 of each fragment.
"""

from __future__ import annotations

import hashlib

WORDS = 8


def probe_queries(text: str, words: int = WORDS) -> list[str]:
    """Up to three distinct fragments of ``words`` words: first, middle, last (fewer for short text)."""
    tokens = text.split()
    if not tokens:
        return []
    if len(tokens) <= words:
        return [" ".join(tokens)]
    middle = max(0, (len(tokens) - words) // 2)
    picks = [tokens[:words], tokens[middle : middle + words], tokens[-words:]]
    out: list[str] = []
    for pick in picks:
        fragment = " ".join(pick)
        if fragment not in out:
            out.append(fragment)
    return out


def query_sha256(query: str) -> str:
    return hashlib.sha256(query.encode("utf-8")).hexdigest()
