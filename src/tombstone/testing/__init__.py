"""Reusable test machinery: the adapter conformance suite."""

from tombstone.testing.conformance import AdapterConformance, ConformanceEnv

__all__ = ["AdapterConformance", "ConformanceEnv"]
