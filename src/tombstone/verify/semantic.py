"""The semantic level: did the artifact's neighbourhood keep a trace of it?

Measured, not looked up: the drift of the nearest neighbours of the artifact's probe queries from a
snapshot taken before suppression to after reclaim, compared with same-cluster controls from the same
data, with a confidence interval. Not implemented in this release: the stage raises NotImplementedError
and every receipt shows the semantic probe as not run, with that reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tombstone.capabilities import Capability
from tombstone.lineage.records import ArtifactRecord
from tombstone.verify.levels import Level

if TYPE_CHECKING:
    from tombstone.verify.runner import VerifyContext


class SemanticStage:
    """The semantic level as a stage of the verification pipeline."""

    level = Level.SEMANTIC
    capability = Capability.SEMANTIC_PROBE

    def unsupported(self, adapter: Any) -> str:
        own = adapter.unsupported_reason(self.level)
        if own:
            return own
        return f"{adapter.backend} declares no semantic probe"

    def run(self, ctx: "VerifyContext", adapter: Any, artifacts: Sequence[ArtifactRecord]):
        raise NotImplementedError("the semantic probe (neighbourhood drift against same-cluster controls)"
                                  " is not implemented in this release")


STAGE = SemanticStage()
