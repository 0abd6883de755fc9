"""Erasure requests (``tombstone request``): deadlines under GDPR Art. 12(3), extensions, an Art. 17(3) exception
that leaves a store's records untouched and OUT_OF_SCOPE on the receipt, and the receipt that answers a request
(one whose artifacts still need action does not). Real SQLite docstores."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from click.testing import CliRunner

from tombstone import Tombstone, init_deployment
from tombstone.cli import main
from tombstone.errors import ConfigError
from tombstone.requests import Requests, Retention, add_months
from tombstone_adapters.docstore import DocStore

from support import write_docs


def cli(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def two_stores(tmp_path):
    """A deployment with a docstore ``docs`` and a second one, ``archive``, each holding Alice's and Bob's notes."""
    config = init_deployment(tmp_path / "deploy", {"docs": {"backend": "docstore", "path": "stores/docs.db"},
                                                    "archive": {"backend": "docstore", "path": "stores/archive.db"}})
    with Tombstone(config) as tomb:
        for store in ("docs", "archive"):
            DocStore(config.stores[store].options["path"]).close()
        for subject in ("alice", "bob"):
            write_docs(tomb, subject, 2)
            archive = DocStore(config.stores["archive"].options["path"], lineage=tomb.lineage, store="archive")
            archive.add_many([(f"{subject}-invoice-{n}", f"invoice {n} of {subject}", {}) for n in range(2)],
                             subject=subject)
            archive.close()
    return config


def test_the_deadline_is_one_calendar_month_and_extends_by_two_at_most():
    assert add_months(dt.date(2026, 1, 31), 1) == dt.date(2026, 2, 28)
    assert add_months(dt.date(2028, 1, 31), 1) == dt.date(2028, 2, 29)
    assert add_months(dt.date(2026, 11, 30), 3) == dt.date(2027, 2, 28)
    assert add_months(dt.date(2026, 12, 15), 1) == dt.date(2027, 1, 15)


def test_a_request_runs_from_add_to_answered_with_a_store_kept_by_exception(two_stores):
    """Alice's archive is kept under an Art. 17(3) exception: the erasure leaves its records untouched and live,
    and the receipt says OUT_OF_SCOPE(retained by exception) for each, with no probe run; the docstore's are
    VERIFIED. The request is then answered by that receipt."""
    config = two_stores
    assert cli("request", "add", "alice", "--received", "2026-11-20", "--reference", "T-81", "--basis",
               "Art. 17(1)(a)", "--retain", "archive:tax law, Art. 17(3)(b):2099-12-31", "--config",
               str(config.path)).exit_code == 0
    listed = cli("request", "list", "--today", "2026-12-01", "--config", str(config.path))
    assert listed.exit_code == 0 and "R-0001" in listed.output and "2026-12-20" in listed.output
    assert "open" in listed.output and "archive: tax law, Art. 17(3)(b), until 2099-12-31" in listed.output

    erased = cli("erase", "alice", "--config", str(config.path))
    assert erased.exit_code == 0, erased.output
    receipt = json.loads((config.receipts_dir / "alice.json").read_text())
    by_store = {}
    for art in receipt["artifacts"]:
        by_store.setdefault(art["store"], []).append(art)
    assert {(a["status"], a["level"]) for a in by_store["docs"]} == {("VERIFIED", "physical")}
    kept = by_store["archive"]
    assert len(kept) == 2 and {a["status"] for a in kept} == {"OUT_OF_SCOPE"}
    assert all(a["reason"].startswith("retained by exception: tax law") and "R-0001" in a["reason"] for a in kept)
    assert all(a["evidence"]["suppression"]["recorded"] is False for a in kept)
    assert all(not p["ran"] for a in kept for p in a["evidence"]["probes"])
    archive = DocStore(config.stores["archive"].options["path"])
    try:  # the records are still there, readable: kept, not erased
        assert archive.get("alice-invoice-0") is not None and archive.get("alice-invoice-1") is not None
    finally:
        archive.close()
    with Tombstone(config) as tomb:
        assert {a.state for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key("alice"))
                if a.store == "archive"} == {"live"}
    listed = cli("request", "list", "--today", "2026-12-01", "--config", str(config.path))
    assert listed.exit_code == 0 and "answered" in listed.output
    assert receipt["receipt_hash"].split(":")[-1][:12] in listed.output


def test_an_exception_that_has_ended_keeps_nothing(two_stores):
    with Tombstone(two_stores) as tomb:
        Requests(tomb.lineage).add("bob", dt.date(2026, 11, 1), today=dt.date(2026, 12, 1),
                                   retentions=[Retention("archive", "contract", dt.date(2026, 11, 15))])
        receipt, _ = tomb.erase("bob")
    assert {a["status"] for a in receipt["artifacts"]} == {"VERIFIED"} and len(receipt["artifacts"]) == 4


def test_an_overdue_request_makes_the_list_exit_1_and_an_extension_moves_it(two_stores):
    path = str(two_stores.path)
    assert cli("request", "add", "bob", "--received", "2026-10-01", "--config", path).exit_code == 0
    late = cli("request", "list", "--today", "2026-11-02", "--config", path)
    assert late.exit_code == 1 and "overdue" in late.output and "1 day(s) late" in late.output
    assert cli("request", "list", "--today", "2026-10-25", "--config", path).exit_code == 0  # due soon, not late
    assert "due soon" in cli("request", "list", "--today", "2026-10-25", "--config", path).output
    no_reason = cli("request", "extend", "R-0001", "--months", "2", "--reason", " ", "--config", path)
    assert no_reason.exit_code == 2 and "needs --reason" in no_reason.output
    assert cli("request", "extend", "R-0001", "--months", "1", "--reason", "volume", "--config", path).exit_code == 0
    too_far = cli("request", "extend", "R-0001", "--months", "2", "--reason", "more", "--config", path)
    assert too_far.exit_code == 2 and "2 further months in all" in too_far.output
    assert cli("request", "extend", "R-0001", "--months", "1", "--reason", "more", "--config", path).exit_code == 0
    assert cli("request", "list", "--today", "2026-11-02", "--config", path).exit_code == 0
    listed = cli("request", "list", "--today", "2027-01-02", "--config", path)
    assert listed.exit_code == 1 and "2027-01-01 (extended)" in listed.output


def test_a_receipt_whose_artifacts_need_action_does_not_answer_the_request(two_stores):
    with Tombstone(two_stores) as tomb:
        [doc, _] = [a.artifact_id for a in tomb.lineage.artifacts_for(tomb.lineage.subject_key("alice"))
                    if a.store == "docs"]
        tomb.lineage.record_third_party("alice", "docs", doc, "acme-analytics")
        requests = Requests(tomb.lineage)
        requests.add("alice", dt.date(2026, 12, 1), today=dt.date(2026, 12, 2))
        receipt, _ = tomb.erase("alice")
        assert "NEEDS_HUMAN" in {a["status"] for a in receipt["artifacts"]}  # the control: something is left
        [request] = requests.refresh()
        assert request.answered_at is None and request.state(dt.date(2026, 12, 2)) == "open"


@pytest.mark.parametrize("args, message", [
    (["--received", "2026-13-01"], "--received must be a date"),
    (["--received", "2999-01-01"], "is after today"),
    (["--received", "2026-11-01", "--retain", "nowhere:legal hold"], "names store 'nowhere', which is not configured"),
    (["--received", "2026-11-01", "--retain", "archive"], "--retain takes STORE:REASON"),
])
def test_bad_input_is_one_line_and_records_nothing(two_stores, args, message):
    result = cli("request", "add", "alice", *args, "--config", str(two_stores.path))
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1
    with Tombstone(two_stores) as tomb:
        assert Requests(tomb.lineage).refresh() == []
    with pytest.raises(ConfigError):
        Retention.parse("archive:", ["archive"])
