"""Erasure sagas: journaled, idempotent steps from suppression to the signed receipt."""

from tombstone.saga.context import RetryPolicy, SagaContext
from tombstone.saga.engine import STEPS, Saga, run_batch, run_step

__all__ = ["RetryPolicy", "STEPS", "Saga", "SagaContext", "run_batch", "run_step"]
