"""Plain-language explanations of receipt statuses, for people who read reports rather than receipts.

Each explanation says what the status shows and what it does not; the next step is always the artifact's
own ``action`` as the receipt recorded it (never rewritten here). The wording follows
verification-levels.md, which has the full account per backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from tombstone.receipt.model import ArtifactEntry
from tombstone.verify.levels import Level, StatusKind

BEYOND_THE_FILES = ("backups and snapshots, replicas, write-ahead logs shipped or"
                    " archived elsewhere, logs kept by hosting providers, disk blocks the filesystem has not"
                    " reused yet, and copies made by code that bypassed the wrappers")

_VERIFIED = {
    Level.LOGICAL: ("No query path Tombstone knows of returns the artifact any more (lookup by id, filters,"
                    " nearest-neighbour queries with the artifact's probe vectors).",
                    "That its bytes left storage, or that a path bypassing the wrapper cannot reach it."),
    Level.PHYSICAL: ("No query path returns it, and once the store had reclaimed its space a byte scan of every"
                     " file the store keeps found neither the artifact's id nor its content pattern.",
                     f"Copies outside those files: {BEYOND_THE_FILES}."),
    Level.SEMANTIC: ("The lower levels passed, and the neighbourhood of similar records shows no measurable trace"
                     " of it.",
                     "Presence or absence of the content itself; a measurement, not a proof."),
    Level.MODEL: ("The lower levels passed, the weights trained on it were replaced, and canary exposure,"
                  " extraction and membership-inference attacks on the model no longer tell the subject apart from"
                  " people it never saw, while before the erasure they did.",
                  "That stronger attacks fail: unlearning checks are known to be fragile (arXiv:2408.00929)."),
}

_RESIDUAL = {
    Level.LOGICAL: "A query path still returns the artifact: it is not erased.",
    Level.PHYSICAL: "Its bytes are still in the store's files: it is hidden from queries but not erased from storage.",
    Level.SEMANTIC: "The neighbourhood still answers as if the artifact were there: near-copies may remain.",
    Level.MODEL: "The model can still reproduce it.",
}


@dataclass(frozen=True)
class Explanation:
    """What a status shows, what it does not, and whether it leaves work for a person."""

    shows: str
    """What the status establishes, in plain words."""
    does_not_show: str
    """Its limits: what a reader must not conclude from it."""
    ceiling: bool = False
    """UNVERIFIED at the backend's ceiling: the most this backend can be checked to, nothing a person can fix."""


def _unverified(reason: str, action: str | None, logical_passed: bool) -> Explanation:
    why = reason.split(":", 1)[1].strip() if ":" in reason else reason
    if reason.startswith("dlq"):
        return Explanation("A store operation failed past its retry budget (the last error is in the status); the"
                           " erasure of this artifact did not complete, so nothing is claimed about it.",
                           "That the artifact is still there: only that it was not checked.")
    if reason.startswith("no adapter"):
        return Explanation("No installed adapter serves this store: nothing was done or checked there.",
                           "Anything about the store's contents.")
    if reason.startswith("lineage gap"):
        return Explanation("The lineage record around this artifact is incomplete: it may have copies Tombstone"
                           " does not know of.",
                           "That those copies exist; only that they could not be ruled out.")
    if reason.startswith("duplicate content"):
        return Explanation("The artifact's id is gone, but identical bytes belong to another subject's live record;"
                           " no scan can tell identical bytes apart, and that record is never deleted to make the"
                           " receipt look better.",
                           "That the erased artifact's own copy remains: the bytes belong to someone else too.",
                           ceiling=action is None)
    if reason.startswith("logical probe did not run"):
        return Explanation("No query path was checked, so nothing is claimed.", "Presence or absence.")
    if reason.startswith("physical"):
        passed = " The logical probe passed: no query returns it." if logical_passed else ""
        if action is None:
            managed = " The store is a managed service whose storage cannot be read." if "managed" in why else ""
            return Explanation(f"Its storage could not be scanned.{managed}{passed} This is the most this backend can"
                               " be checked to: nothing a person can fix here.",
                               "That the bytes left the provider's storage; the provider's own deletion"
                               " guarantees are all there is.", ceiling=True)
        return Explanation(f"The byte scan of the store's files could not run (the status says why), so nothing is"
                           f" claimed about storage.{passed}",
                           "That the bytes are still there: only that they were not checked.")
    if reason.startswith("semantic"):
        return Explanation("The query paths and the store's files were checked and found nothing, but the"
                           " neighbourhood could not be measured: none of the artifact's probe queries finds it among"
                           " their first results, so its removal leaves no hole to compare with ordinary deletions."
                           " Nothing a person can fix here.",
                           "Whether a near-copy, paraphrase or summary of it remains in the store.",
                           ceiling=action is None)
    return Explanation("It could not be checked, so nothing is claimed.", "Presence or absence.")


def explain(entry: ArtifactEntry) -> Explanation:
    """The plain-language reading of one artifact's status."""
    if entry.status is StatusKind.VERIFIED and entry.level is not None:
        shows, limits = _VERIFIED[entry.level]
        return Explanation(shows, limits)
    if entry.status is StatusKind.RESIDUAL and entry.level is not None:
        found = f" Found: {entry.measurement}." if entry.measurement else ""
        return Explanation(_RESIDUAL[entry.level] + found, "Which copy is meant when the id is short or generic:"
                           " a match errs towards RESIDUAL, never towards VERIFIED.")
    if entry.status is StatusKind.NEEDS_HUMAN:
        return Explanation("A copy left for a third party, beyond Tombstone's reach: no probe can check it, so a"
                           " person must follow it up.", "Anything about that copy.")
    if entry.status is StatusKind.OUT_OF_SCOPE:
        return Explanation("No probe of this tool reaches it.", "Anything about it.")
    logical = entry.probe(Level.LOGICAL)
    return _unverified(entry.reason or "", entry.action, bool(logical and logical.ran and logical.passed))


__all__ = ["BEYOND_THE_FILES", "Explanation", "explain"]
