"""The model level: can model weights trained on the artifact still reproduce it?

Measured, not looked up: greedy extraction from the subject's prefixes and membership inference (loss,
Min-K%) against held-out data, with a bootstrap confidence interval. Not implemented in this release: the
stage raises NotImplementedError and receipts show the model probe as not run, with that reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tombstone.capabilities import Capability
from tombstone.lineage.records import ArtifactRecord
from tombstone.verify.levels import Level

if TYPE_CHECKING:
    from tombstone.verify.runner import VerifyContext


class ModelStage:
    """The model level as a stage of the verification pipeline."""

    level = Level.MODEL
    capability = Capability.MODEL_PROBE

    def unsupported(self, adapter: Any) -> str:
        own = adapter.unsupported_reason(self.level)
        if own:
            return own
        return f"{adapter.backend} holds no model weights"

    def run(self, ctx: "VerifyContext", adapter: Any, artifacts: Sequence[ArtifactRecord]):
        raise NotImplementedError("the model probe (extraction and membership inference) is not implemented"
                                  " in this release")


STAGE = ModelStage()
