"""sqlite-vec backend: the ``VecStore`` wrapper apps write through (a vec0 table in one SQLite file, opened
with apsw), and its adapter."""

from .store import VecStore

__all__ = ["SqliteVecAdapter", "VecStore"]


def __getattr__(name: str):
    if name == "SqliteVecAdapter":
        from .adapter import SqliteVecAdapter

        return SqliteVecAdapter
    raise AttributeError(name)
