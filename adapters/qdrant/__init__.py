"""Qdrant local-mode backend: the ``TombstoneQdrant`` wrapper apps use, and its adapter."""

from . import points as _points
from .wrapper import SUPPRESSED, TombstoneQdrant, merge_filter, point_id

# Before any local-mode client opens a directory in this process: stored points are unpickled with the
# restricted unpickler, so a planted row is refused instead of run (``points``).
_points.install()

__all__ = ["QdrantAdapter", "SUPPRESSED", "TombstoneQdrant", "close_local_clients", "local_client",
           "merge_filter", "point_id"]


def __getattr__(name: str):
    if name in ("QdrantAdapter", "local_client", "close_local_clients"):
        from . import adapter

        return getattr(adapter, name)
    raise AttributeError(name)
