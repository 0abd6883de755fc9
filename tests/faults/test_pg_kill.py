"""The embedded PostgreSQL killed with SIGKILL while the pgvector reclaim runs VACUUM FULL (the table and its
HNSW index written anew) or the ANALYZE that rebuilds the statistics, then started again and the erasure resumed
(``tombstone_adapters.pgvector.killtrials``): no survivor lost, no VERIFIED while erased bytes remain in the
table's files (or in files a killed statement left), the saga finished on resume or dead-lettered with a
one-line reason, and a non-zero exit while work remains."""

from __future__ import annotations

import pytest

from tombstone_adapters.pgvector.killtrials import STATEMENTS, trial


def check(result: dict) -> None:
    said = f"erase rc {result['erase_rc']}: {result['erase_stderr'][-600:]}\nresume rc {result['resume_rc']}:" \
           f" {result['resume_stdout'][-600:]} {result['resume_stderr'][-600:]}"
    # Controls: the statement really was the one killed, and the independent reading can find erased bytes.
    assert result["killed_statement"].upper().startswith(STATEMENTS[result["statement"]][0]), result["killed_statement"]
    assert result["leaks_before"] and all(result["leaks_before"].values()), result["leaks_before"]
    assert result["survivors_lost"] == 0, said
    assert result["false_verified"] == 0, (result["leaks"], result["statuses"])
    assert result["finished_on_resume"] or result["dead_lettered"], said
    said += f"\ndead letters: {result['dead_letters']}\nreasons: {result['reasons']}"
    for reason in result["dead_letters"]:
        assert reason.strip() and "\n" not in reason.strip(), reason
    if result["victim"] == "host":
        assert result["erase_rc"] != 0  # killed with the server
    elif result["erase_rc"] == 0:
        # the erasure finished by itself (its retry started the server again): nothing left to resume
        assert "no interrupted erasure to resume" in result["resume_stdout"], said
    if not result["finished_on_resume"]:
        assert result["resume_rc"] != 0, said  # work remains: never exit 0
    elif result["dead_lettered"]:
        # finished with a receipt that says what is left to do: never VERIFIED, and never exit 0
        assert "VERIFIED" not in {s for s, _ in result["statuses"].values()}, result["statuses"]
        assert (result["resume_rc"] if result["victim"] == "host" else result["erase_rc"]) != 0, said
    else:
        assert set(result["statuses"]) and {s for s, _ in result["statuses"].values()} == {"VERIFIED"}, \
            (result["statuses"], result["reasons"], said)
        assert result["leaks"] == {}, result["leaks"]


@pytest.mark.slow
@pytest.mark.parametrize("statement", sorted(STATEMENTS))
def test_server_killed_mid_statement_then_restarted_and_resumed(statement, tmp_path):
    check(trial(tmp_path, statement, "host"))


@pytest.mark.slow
def test_backend_killed_during_vacuum_full_the_server_recovers_and_the_erasure_finishes(tmp_path):
    check(trial(tmp_path, "vacuum_full", "backend"))


@pytest.mark.slow
def test_postmaster_alone_killed_during_vacuum_full(tmp_path):
    check(trial(tmp_path, "vacuum_full", "postmaster"))
