"""The status lattice: every rule, and that the first match wins."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tombstone.errors import NotSuppressedError, ScopeViolationError
from tombstone.verify.levels import RULES, Findings, Level, Status, StatusKind, decide
from tombstone.verify.result import NotRun, ProbeResult


def outcome(level: Level, passed: bool | None, measurement: str | None = None, unsupported: str | None = None):
    """A probe outcome: passed True/False (ran), or None / unsupported (did not run)."""
    if unsupported or passed is None:
        return NotRun(level, unsupported or "not run", ceiling=unsupported == "managed")
    return ProbeResult(level, passed, None if passed else (measurement or "found"))


def F(artifact_id="a1", *, logical_passed=True, logical_measurement=None, physical_passed=True,
      physical_measurement=None, physical_unsupported=None, semantic_passed=None, semantic_residual=None,
      model_passed=None, model_residual=None, **identity) -> Findings:
    """Findings from one flag per level (the lattice reads the per-level outcomes built here)."""
    probes = {
        Level.LOGICAL: outcome(Level.LOGICAL, logical_passed, logical_measurement),
        Level.PHYSICAL: outcome(Level.PHYSICAL, physical_passed, physical_measurement, physical_unsupported),
        Level.SEMANTIC: outcome(Level.SEMANTIC, False if semantic_residual else semantic_passed, semantic_residual),
        Level.MODEL: outcome(Level.MODEL, False if model_residual else model_passed, model_residual),
    }
    return Findings(artifact_id=artifact_id, probes=probes, **identity)


CLEAN = {"suppressed": True}
"""Every probe ran and passed (semantic and model did not run), suppression recorded."""


def replace(base: dict, **change) -> Findings:
    """Findings of ``base`` flags with some identity fields or per-level flags changed."""
    return F(**{**base, **change})


def test_rule_order_is_the_specs():
    assert [r.name for r in RULES] == [
        "scope_violation",
        "retained",
        "not_suppressed",
        "dlq",
        "no_adapter",
        "lineage_gap",
        "third_party",
        "logical_fail",
        "physical_unsupported",
        "physical_fail",
        "duplicate_content",
        "model_residual",
        "semantic_residual",
        "semantic_not_testable",
        "logical_not_run",
        "verified",
    ]


def test_scope_violation_raises():
    with pytest.raises(ScopeViolationError):
        decide(replace(CLEAN, scope_violation="subject B"))


def test_not_suppressed_raises():
    with pytest.raises(NotSuppressedError):
        decide(replace(CLEAN, suppressed=False))


@pytest.mark.parametrize(
    ("change", "kind", "level", "text"),
    [
        ({"dlq_error": "timeout"}, StatusKind.UNVERIFIED, None, "dlq: timeout"),
        ({"no_adapter": "chroma"}, StatusKind.UNVERIFIED, None, "no adapter: chroma"),
        ({"lineage_gap": "source missing"}, StatusKind.UNVERIFIED, None, "lineage gap: source missing"),
        ({"third_party": "acme export"}, StatusKind.NEEDS_HUMAN, None, "third party: acme export"),
        ({"logical_passed": False, "logical_measurement": "get"}, StatusKind.RESIDUAL, Level.LOGICAL, "get"),
        ({"physical_unsupported": "managed"}, StatusKind.UNVERIFIED, None, "physical: managed"),
        ({"physical_passed": None}, StatusKind.UNVERIFIED, None, "physical: not run"),
        ({"physical_passed": False, "physical_measurement": "id 2x"}, StatusKind.RESIDUAL, Level.PHYSICAL, "id 2x"),
        ({"duplicate_content": "1 survivor"}, StatusKind.UNVERIFIED, None, "duplicate content: 1 survivor"),
        ({"model_residual": "MIA auc 0.71"}, StatusKind.RESIDUAL, Level.MODEL, "MIA auc 0.71"),
        ({"semantic_residual": "drift 0.3"}, StatusKind.RESIDUAL, Level.SEMANTIC, "drift 0.3"),
        ({"semantic_not_testable": "in its own Top-5 for 1 of 5"}, StatusKind.UNVERIFIED, None,
         "semantic: not testable, in its own Top-5 for 1 of 5"),
        ({"logical_passed": None}, StatusKind.UNVERIFIED, None, "logical probe did not run"),
        ({}, StatusKind.VERIFIED, Level.PHYSICAL, None),
        ({"model_passed": True}, StatusKind.VERIFIED, Level.MODEL, None),
        ({"semantic_passed": True}, StatusKind.VERIFIED, Level.SEMANTIC, None),
        ({"semantic_passed": True, "model_passed": True}, StatusKind.VERIFIED, Level.MODEL, None),
    ],
)
def test_each_rule(change, kind, level, text):
    status = decide(replace(CLEAN, **change))
    assert status.kind is kind
    assert status.level is level
    if text:
        assert text in (status.reason or status.measurement)


def test_actions_say_what_is_left_to_do():
    """RESIDUAL and NEEDS_HUMAN always carry an action; a backend's ceiling and VERIFIED never do."""
    assert decide(replace(CLEAN)).action is None
    assert decide(replace(CLEAN, physical_unsupported="managed")).action is None  # the backend's ceiling
    assert "readable" in decide(replace(CLEAN, physical_unsupported="file not readable")).action
    assert decide(replace(CLEAN, duplicate_content="1 survivor")).action is None
    assert "dlq retry" in decide(replace(CLEAN, dlq_error="timeout")).action
    assert decide(replace(CLEAN, physical_passed=False)).action
    assert decide(replace(CLEAN, third_party="acme")).action
    assert decide(replace(CLEAN, lineage_gap="source missing")).action
    assert decide(replace(CLEAN, no_adapter="chroma")).action
    assert decide(replace(CLEAN, semantic_not_testable="too few probes")).action is None  # nothing to fix
    assert decide(replace(CLEAN, semantic_residual="drift")).action


def test_semantic_not_testable_sits_next_to_semantic_residual():
    """A measured echo outranks a level that could not measure; a physical finding outranks both."""
    assert decide(replace(CLEAN, semantic_not_testable="x", semantic_residual="drift")).rule == "semantic_residual"
    assert decide(replace(CLEAN, semantic_not_testable="x", physical_passed=False)).rule == "physical_fail"
    assert decide(replace(CLEAN, semantic_not_testable="x", logical_passed=None)).rule == "semantic_not_testable"


def test_physical_unsupported_is_never_verified_by_omission():
    """Rule 5 before rule 6 and 9: a store that cannot be checked is UNVERIFIED even if nothing else failed."""
    status = decide(replace(CLEAN, physical_passed=None, physical_unsupported="managed"))
    assert status.kind is StatusKind.UNVERIFIED


def test_order_matters_first_match_wins():
    """An artifact matching several rules gets the earliest one's status."""
    everything = dict(
        CLEAN,
        dlq_error="down",
        third_party="acme",
        logical_passed=False,
        logical_measurement="get",
        physical_passed=False,
        physical_measurement="id",
    )
    assert decide(F(**everything)).rule == "dlq"
    assert decide(replace(everything, dlq_error=None)).rule == "third_party"
    assert decide(replace(everything, dlq_error=None, third_party=None)).rule == "logical_fail"
    both_physical = replace(CLEAN, physical_unsupported="managed", physical_passed=False, physical_measurement="x")
    assert decide(both_physical).rule == "physical_unsupported"


_findings = st.builds(
    F,
    artifact_id=st.just("a"),
    suppressed=st.just(True),
    dlq_error=st.one_of(st.none(), st.just("e")),
    no_adapter=st.one_of(st.none(), st.just("x")),
    lineage_gap=st.one_of(st.none(), st.just("g")),
    third_party=st.one_of(st.none(), st.just("t")),
    logical_passed=st.one_of(st.none(), st.booleans()),
    physical_unsupported=st.one_of(st.none(), st.just("m")),
    physical_passed=st.one_of(st.none(), st.booleans()),
    duplicate_content=st.one_of(st.none(), st.just("d")),
    model_passed=st.one_of(st.none(), st.booleans()),
    model_residual=st.one_of(st.none(), st.just("r")),
    semantic_passed=st.one_of(st.none(), st.booleans()),
    semantic_residual=st.one_of(st.none(), st.just("s")),
    semantic_not_testable=st.one_of(st.none(), st.just("n")),
)


@given(_findings)
def test_decide_is_the_first_matching_rule(findings):
    first = next(rule for rule in RULES if rule.matches(findings))
    status = decide(findings)
    assert status.rule == first.name
    if status.kind is StatusKind.VERIFIED:
        # nothing on the way down matched: every probe ran and passed
        assert findings.ran(Level.LOGICAL) and findings.probes[Level.LOGICAL].passed
        assert findings.ran(Level.PHYSICAL) and findings.probes[Level.PHYSICAL].passed
        assert findings.dlq_error is None
        # no level that ran found anything, and the level is the highest one that ran and passed
        assert not any(findings.failed(lv) for lv in Level)
        assert status.level is max((lv for lv in Level if findings.ran(lv)), key=lambda lv: lv.rank)


@given(_findings, _findings)
def test_a_remembered_decision_is_the_one_the_rules_make(first, second):
    """``decide`` keeps the statuses it made, by what the rules read: each answer is still the rules' own for
    the findings it is given, whichever came before it."""
    from tombstone.verify.levels import _decide

    for findings in (first, second, first):
        try:
            expected = _decide(findings)
        except (ScopeViolationError, NotSuppressedError) as exc:
            with pytest.raises(type(exc)):
                decide(findings)
            continue
        assert decide(findings) == expected


def test_status_invariants():
    with pytest.raises(ValueError):
        Status(StatusKind.VERIFIED)
    with pytest.raises(ValueError):
        Status(StatusKind.UNVERIFIED, level=Level.LOGICAL, reason="x")
    with pytest.raises(ValueError):
        Status(StatusKind.RESIDUAL, level=Level.PHYSICAL)
    with pytest.raises(ValueError):
        Status(StatusKind.RESIDUAL, level=Level.PHYSICAL, measurement="id 1x")  # no action
    with pytest.raises(ValueError):
        Status(StatusKind.VERIFIED, level=Level.PHYSICAL, action="nothing")
    assert str(Status(StatusKind.VERIFIED, level=Level.PHYSICAL)) == "VERIFIED(physical)"
