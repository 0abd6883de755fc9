"""Pinecone backend (managed): the ``TombstonePinecone`` wrapper, its adapter, and a local EMULATOR of
the data-plane API used by the tests and the demo (the service itself is not reachable from here)."""

from .wrapper import SUPPRESSED, TombstonePinecone, merge_filter

__all__ = ["PineconeAdapter", "PineconeEmulator", "SUPPRESSED", "TombstonePinecone", "merge_filter"]


def __getattr__(name: str):
    if name == "PineconeAdapter":
        from .adapter import PineconeAdapter

        return PineconeAdapter
    if name == "PineconeEmulator":
        from .emulator import PineconeEmulator

        return PineconeEmulator
    raise AttributeError(name)
