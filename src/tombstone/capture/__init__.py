"""Capture at write time: probe fragments, fingerprints and the offline default embedder."""

from tombstone.capture.embedders import HashingEmbedder, MiniLMEmbedder
from tombstone.capture.fragments import probe_queries, query_sha256
from tombstone.lineage.db import fingerprint_of

__all__ = ["HashingEmbedder", "MiniLMEmbedder", "fingerprint_of", "probe_queries", "query_sha256"]
