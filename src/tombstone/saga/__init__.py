"""Erasure sagas: journaled, idempotent steps from suppression to the signed receipt."""

from tombstone.saga.engine import ALWAYS_OUT_OF_SCOPE, STEPS, Saga

__all__ = ["ALWAYS_OUT_OF_SCOPE", "STEPS", "Saga"]
