"""check_store on a PostgreSQL store: each invariant broken on purpose by another program's connection, found
and named; repair fixes what is derived, exactly, while other threads write; the rest is left as it is."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import POSTGRES_URL
from helpers import make_job, make_targets, snapshot

from sift import dcache

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg(pg_target: str) -> Iterator[str]:
    """A store of the test's own, open, holding three jobs (non-ASCII results: bytes differ from
    characters); yields its schema."""
    dcache.open_db(pg_target)
    dcache.create_batch_job(make_job("job-a", targets_total=3), make_targets(3))
    dcache.update_batch_target("job-a", 0, "done", result="héllo", now=1_000)  # 6 bytes
    dcache.update_batch_target("job-a", 1, "failed", result="😀", error="x", now=1_000)  # 4 bytes
    dcache.create_batch_job(make_job("job-b", targets_total=2), make_targets(2))
    dcache.update_batch_target("job-b", 1, "done", result="ok", now=1_000)
    dcache.create_batch_job(make_job("job-c", targets_total=1), make_targets(1))
    yield pg_target.rpartition("schema=")[2]
    dcache.close_db()


def foreign(schema: str, *statements: str) -> None:
    """Statements run as another program would: a connection of its own."""
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        for statement in statements:
            conn.execute(statement)


def found(report: dcache.StoreReport) -> set[tuple[str, str | None]]:
    return {(v.kind, v.job_id) for v in report.violations}


#: name: (the other program's statements, what check must name)
REPAIRABLE: dict[str, tuple[list[str], set[tuple[str, str | None]]]] = {
    "targets_done": (
        ["UPDATE batch_job SET targets_done = 3 WHERE id = 'job-a'"],
        {("targets_done", "job-a")},
    ),
    "nbytes": (["UPDATE batch_job SET nbytes = 2 WHERE id = 'job-a'"], {("nbytes", "job-a")}),
    "slot_drift": (["UPDATE batch_totals SET nbytes = nbytes + 7 WHERE slot = 5"], {("total", None)}),
    "slot_missing": (["DELETE FROM batch_totals WHERE slot = 5"], {("total", None)}),
    "slot_extra": (["INSERT INTO batch_totals (slot, nbytes) VALUES (16, 0)"], {("total", None)}),
    "orphans": (["DELETE FROM batch_job WHERE id = 'job-b'"], {("orphan_targets", "job-b")}),
    "dropped_index": (["DROP INDEX batch_job_evictable"], {("schema", None)}),
    "dropped_claim_index": (["DROP INDEX batch_target_host"], {("schema", None)}),
    "dropped_trigger": (
        [
            "DROP TRIGGER batch_totals_track ON batch_job",
            "UPDATE batch_job SET nbytes = 0 WHERE id = 'job-b'",
        ],
        {("schema", None), ("total", None), ("nbytes", "job-b")},
    ),
    "disabled_trigger": (["ALTER TABLE batch_job DISABLE TRIGGER batch_totals_track"], {("schema", None)}),
    "dropped_function": (["DROP FUNCTION sift_json_valid"], {("schema", None)}),
    "dropped_totals": (["DROP TABLE batch_totals"], {("schema", None)}),
}

#: name: (statements, what check must name); a person decides: check and repair leave them as they are.
FOR_A_PERSON: dict[str, tuple[list[str], set[tuple[str, str | None]]]] = {
    "job_status": (
        ["UPDATE batch_job SET status = 'archived' WHERE id = 'job-c'"],
        {("job_status", "job-c")},
    ),
    "target_status": (
        ["UPDATE batch_target SET status = 'lost' WHERE job_id = 'job-b' AND idx = 0"],
        {("target_status", "job-b")},
    ),
    "target_idx": (["UPDATE batch_target SET idx = 7 WHERE job_id = 'job-c'"], {("target_idx", "job-c")}),
    "version": (["UPDATE sift_schema SET version = 99"], {("schema_version", None)}),
}


def test_a_clean_store_passes(pg: str) -> None:
    report = dcache.check_store()
    assert report.ok and (report.jobs, report.targets) == (3, 6) and report.repairs == []


@pytest.mark.parametrize("case", sorted(REPAIRABLE))
def test_each_derived_invariant_is_found_then_repaired(pg: str, case: str) -> None:
    statements, expected = REPAIRABLE[case]
    foreign(pg, *statements)
    before = snapshot()
    report = dcache.check_store()
    assert found(report) == expected, report
    assert snapshot() == before  # a check writes nothing
    repaired = dcache.check_store(repair=True)
    assert found(repaired) == expected
    recomputed = {"total"} if case == "dropped_totals" else set()  # the new table's slots start at 0
    assert {r.kind for r in repaired.repairs} == {kind for kind, _ in expected} | recomputed
    again = dcache.check_store()
    assert again.ok, again
    assert dcache.batch_nbytes() == (10 if case == "orphans" else 12)


@pytest.mark.parametrize("case", sorted(FOR_A_PERSON))
def test_what_a_person_decides_is_named_and_left(pg: str, case: str) -> None:
    statements, expected = FOR_A_PERSON[case]
    foreign(pg, *statements)
    before = snapshot()
    assert found(dcache.check_store()) == expected
    repaired = dcache.check_store(repair=True)
    assert found(repaired) == expected and repaired.repairs == []
    assert snapshot() == before


def test_the_details_name_what_is_wrong(pg: str) -> None:
    foreign(
        pg,
        "UPDATE batch_job SET targets_done = 0, nbytes = 1 WHERE id = 'job-a'",
        # Each connection adds to the slot of its backend pid, which no test chooses: set every slot.
        "UPDATE batch_totals SET nbytes = CASE slot WHEN 9 THEN 8 ELSE 0 END",
        "DELETE FROM batch_totals WHERE slot = 2",
        "DROP INDEX batch_job_live",
    )
    details = {str(v) for v in dcache.check_store().violations}
    assert details == {
        "schema: batch_job_live (index) is missing",
        "total: batch_totals should have the slot rows 0..15: [2] missing",
        "total: batch_totals holds 8, but SUM(nbytes) is 3",
        "targets_done (job 'job-a'): targets_done is 0, but 2 targets are done or failed",
        "nbytes (job 'job-a'): nbytes is 1, but its results hold 10 bytes (UTF-8)",
    }


def test_chunks_cover_every_job_once(pg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from sift.dcache import integrity as check

    for n in range(23):
        dcache.create_batch_job(make_job(f"many-{n:02d}", targets_total=2), make_targets(2))
    foreign(pg, "UPDATE batch_job SET targets_done = 1 WHERE id IN ('many-00', 'many-11', 'many-22')")
    monkeypatch.setattr(check, "JOBS_PER_CHUNK", 4)
    monkeypatch.setattr(check, "TARGETS_PER_CHUNK", 5)
    seen: list[int] = []
    report = dcache.check_store(progress=seen.append)
    assert (report.jobs, report.targets) == (26, 52) and sum(seen) == 26 and len(seen) > 6
    assert found(report) == {("targets_done", f"many-{n}") for n in ("00", "11", "22")}


def test_a_read_only_store_is_checked_and_never_written(pg: str, pg_target: str) -> None:
    foreign(pg, "UPDATE batch_job SET nbytes = 2 WHERE id = 'job-a'")
    dcache.open_db(pg_target, readonly=True)
    assert found(dcache.check_store()) == {("nbytes", "job-a")}
    with pytest.raises(dcache.StoreReadOnly):
        dcache.check_store(repair=True)
    dcache.open_db(pg_target)
    assert found(dcache.check_store()) == {("nbytes", "job-a")}


# -- Repair while other threads write -----------------------------------------------------------------------

WRITERS = 4
WRITES = 300


@pytest.mark.slow
def test_repair_is_exact_while_others_write(pg: str) -> None:
    """Writers rewrite results (nbytes and the slots move) while the totals and counts are broken on purpose
    and repaired, round after round: at the end the store is exact."""
    for w in range(WRITERS):
        dcache.create_batch_job(make_job(f"w-{w}", targets_total=8), make_targets(8))
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(w: int) -> None:
        rng = random.Random(w)
        try:
            for _ in range(WRITES):
                idx = rng.randrange(8)
                dcache.update_batch_target(
                    f"w-{w}", idx, rng.choice(["done", "failed"]), result="é" * rng.randrange(50)
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    rounds = 0
    while any(thread.is_alive() for thread in threads) or rounds < 3:
        rounds += 1
        foreign(
            pg,
            f"UPDATE batch_totals SET nbytes = nbytes + {rounds} WHERE slot = {rounds % 16}",
            f"UPDATE batch_job SET targets_done = 0, nbytes = nbytes + 1 WHERE id = 'w-{rounds % WRITERS}'",
        )
        repaired = dcache.check_store(repair=True)
        assert {r.kind for r in repaired.repairs} >= {"total"}
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []
    final = dcache.check_store()
    assert final.ok, final
    assert rounds >= 3


def test_repair_of_orphans_keeps_a_job_created_since(pg: str) -> None:
    """The orphan delete names only targets whose job is still missing when it runs."""
    from sift.dcache import integrity as check

    foreign(pg, "DELETE FROM batch_job WHERE id = 'job-b'")
    real_fix = check._Chunk.fix

    def fix_after_a_create(self: Any) -> list[dcache.reports.Repair]:
        # Between the check's read and its delete another program makes job-b again, with its targets.
        foreign(
            pg,
            "INSERT INTO batch_job (id, caller, caller_class, idem_key, status, targets_total, created_at, "
            "lease) VALUES ('job-b', 'alice', 'fleet', '', 'queued', 2, 1, 1)",
        )
        return real_fix(self)

    check._Chunk.fix = fix_after_a_create  # type: ignore[method-assign]
    try:
        report = dcache.check_store(repair=True)
    finally:
        check._Chunk.fix = real_fix  # type: ignore[method-assign]
    assert found(report) == {("orphan_targets", "job-b")}
    assert len(dcache.batch_targets("job-b") or []) == 2
