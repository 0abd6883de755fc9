"""pgvector backend: the ``PgVectorStore`` wrapper apps use, the embedded server helper, and the adapter."""

__all__ = ["PgVectorAdapter", "PgVectorStore", "embedded_dsn"]


def __getattr__(name: str):
    if name == "PgVectorAdapter":
        from .adapter import PgVectorAdapter

        return PgVectorAdapter
    if name == "PgVectorStore":
        from .store import PgVectorStore

        return PgVectorStore
    if name == "embedded_dsn":
        from .server import embedded_dsn

        return embedded_dsn
    raise AttributeError(name)
