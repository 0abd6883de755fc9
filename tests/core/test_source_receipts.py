"""Erasing named artifacts under a source reference: the second receipt kind."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from tombstone.errors import ReceiptError, ScopeViolationError, UnknownSubjectError
from tombstone.keys import load_private_key
from tombstone.receipt import RECEIPT_KIND, SOURCE_RECEIPT_KIND, receipt_schema, sign, verify
from tombstone.receipt.canonical import UNSIGNED_FIELDS
from tombstone.saga import Saga

from support import write_docs


def test_named_artifacts_of_several_subjects_get_one_source_receipt(tomb):
    alice = write_docs(tomb, "alice", 2)
    bob = write_docs(tomb, "bob", 2)
    receipt, path = tomb.erase_artifacts("source:faq.md", [("docs", alice[0]), ("docs", bob[1])],
                                         statement="superseded by the next indexing run")
    assert receipt["kind"] == SOURCE_RECEIPT_KIND
    assert receipt["subject"] == "source:faq.md"
    assert receipt["statement"] == "superseded by the next indexing run"
    assert sorted(a["artifact_id"] for a in receipt["artifacts"]) == sorted([alice[0], bob[1]])
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"}
    assert {a["evidence"]["scope"] for a in receipt["artifacts"]} == {"named"}
    assert path.is_file()
    public = load_private_key(tomb.config.keys_dir).public_key()
    verify(receipt, public)
    # only the named records went; the subjects' other records stay, and a subject's erasure still works
    receipt2, _ = tomb.erase("alice")
    assert receipt2["kind"] == RECEIPT_KIND
    assert receipt2["previous_receipt_hash"] == receipt["receipt_hash"]


def test_what_was_derived_from_a_named_artifact_goes_with_it(tomb):
    [doc] = write_docs(tomb, "alice", 1)
    [copy_id] = write_docs(tomb, "someone-else", 1, prefix="copy-of-alice-doc")
    tomb.lineage.record_artifacts("someone-else", [], edges=[("docs", doc, "docs", copy_id, "copied")])
    receipt, _ = tomb.erase_artifacts("source:faq.md", [("docs", doc)])
    scopes = {a["artifact_id"]: a["evidence"]["scope"] for a in receipt["artifacts"]}
    assert scopes[doc] == "named"
    assert [s for a, s in scopes.items() if a != doc] == [f"copied from docs/{doc}"]


def test_unknown_artifacts_and_empty_lists_are_refused_before_anything_changes(tomb):
    [doc] = write_docs(tomb, "alice", 1)
    with pytest.raises(ScopeViolationError, match="not recorded"):
        tomb.erase_artifacts("source:faq.md", [("docs", doc), ("docs", "no-such-doc")])
    with pytest.raises(UnknownSubjectError):
        tomb.erase_artifacts("source:faq.md", [])
    assert tomb.lineage.sagas() == []


def test_an_interrupted_source_erasure_resumes_with_its_kind(tomb):
    [doc] = write_docs(tomb, "alice", 1)
    [other] = write_docs(tomb, "bob", 1)
    saga = Saga.start_artifacts(tomb.context, "source:faq.md", [("docs", doc)], statement="cleanup")
    saga.lock.release()  # as if the process had died before running it
    # the next erasure of the same source finishes the interrupted one first, then does its own
    receipt, _ = tomb.erase_artifacts("source:faq.md", [("docs", other)])
    receipts = tomb.lineage.receipts()
    assert len(receipts) == 2 and [r["saga_id"] for r in receipts][0] == saga.saga_id
    assert receipt["kind"] == SOURCE_RECEIPT_KIND and [a["artifact_id"] for a in receipt["artifacts"]] == [other]
    assert tomb.lineage.sagas("running") == []


def test_schema_accepts_both_kinds_and_nothing_else(tomb):
    write_docs(tomb, "alice", 1)
    receipt, _ = tomb.erase("alice")
    key = load_private_key(tomb.config.keys_dir)
    body = {k: v for k, v in receipt.items() if k not in UNSIGNED_FIELDS}
    for kind in (RECEIPT_KIND, SOURCE_RECEIPT_KIND):
        jsonschema.validate(sign({**copy.deepcopy(body), "kind": kind}, key), receipt_schema())
    with pytest.raises(ReceiptError, match="kind"):
        sign({**body, "kind": "tombstone.something-else"}, key)
