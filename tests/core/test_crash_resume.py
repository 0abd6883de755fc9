"""Crash and resume: `tombstone erase` is killed with SIGKILL at every step boundary and at points inside
each reclaim recipe, on real stores, then `tombstone resume` finishes it. The receipt's statuses must equal
a clean run's on an identical copy, and the survivors must be unchanged (see tombstone.testing.crash)."""

from __future__ import annotations

import pytest

from tombstone.testing.crash import prepare, run_trials

# Two demo deployments: a lineage graph (documents → chunks → cached answers) and the file-based stores.
GROUPS = {"graph": "chroma,docstore,exact_cache,semantic_cache", "files": "faiss,qdrant,pgvector"}


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    return {group: prepare(GROUPS[group], tmp_path_factory.mktemp(group)) for group in GROUPS}


@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_kill_at_every_point_and_resume_equals_a_clean_run(templates, group, tmp_path):
    """One trial per kill point of the group; every failing point is named."""
    failures = [f"{point}: {problem}" for point, problem in run_trials(templates[group], tmp_path) if problem]
    assert not failures, "\n".join(failures)


def test_enough_kill_points(templates):
    counts = {g: len(t["points"]) for g, t in templates.items()}
    assert sum(counts.values()) >= 50, counts
