"""The end check of ``sift simulate --hosts``: the store against the hosts' journals, and ``check_store``."""

from __future__ import annotations

import collections
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, JobStatus, TargetStatus
from sift.dcache.models import FINAL_TARGET_STATUSES, IDEM_JOB_STATUSES

from ..report import plural
from .coordinator import STALL_S, HostsRun
from .host import RESCUE_REASON, job_id_of
from .verdicts import Check, store_checks

__all__ = ["check_run"]


@dataclass
class _Seen:
    """The journals, indexed."""

    claims: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)  # -> (host, claim)
    writes: dict[tuple[str, int], list[tuple[int, float]]] = field(default_factory=dict)  # -> (host, t)
    submissions: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    lost: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)  # jobs some host set a final status of

    @classmethod
    def of(cls, journals: dict[int, list[dict[str, Any]]]) -> _Seen:
        seen = cls()
        for host, records in journals.items():
            for r in records:
                if r["k"] == "claim":
                    for job, idx in r["got"]:
                        seen.claims.setdefault((job, idx), []).append((host, r["c"]))
                elif r["k"] == "done":
                    seen.writes.setdefault((r["job"], r["idx"]), []).append((host, r["t"]))
                elif r["k"] == "sub":
                    seen.submissions.append((host, r))
                elif r["k"] == "lost":
                    seen.lost.append((host, r))
                elif r["k"] == "finish":
                    seen.finished.add(r["job"])
        return seen


def check_run(run: HostsRun, budget: int) -> list[Check]:
    """The end check, from the store and the journals alone (the store must be open)."""
    seen = _Seen.of(run.journals)
    killed = run.kill.host if run.kill else None
    J, T = BatchJob, BatchTarget
    mine = f"{run.prefix}-"
    target_rows: Any = T.select(T.job_id, T.idx, T.status, T.result, T.error).where(T.job_id.startswith(mine))
    job_rows: Any = J.select(J.id, J.caller, J.idem_key, J.status, J.error).where(J.id.startswith(mine))
    targets: list[tuple[Any, ...]] = list(target_rows.tuples())
    jobs: list[tuple[Any, ...]] = list(job_rows.tuples())
    checks = [_claimed_once(seen), _claimed_by_writer(seen, targets, killed)]
    checks += store_checks(dcache.check_store(), budget, whole=True)
    checks.append(_rescues_were_right(seen, targets, jobs, killed))
    checks.append(_idempotent(run, seen, jobs))
    bad = {h: code for h, code in run.exit_codes.items() if h != killed and (code != 0 or run.errors[h])}
    checks.append(
        Check(
            "every surviving host ran without error and stopped",
            not bad and not run.stalled,
            (f"the run stalled: no host recorded anything for {STALL_S:.0f} s; " if run.stalled else "")
            + (
                ", ".join(f"host {h}: exit {code}, {len(run.errors[h])} errors" for h, code in bad.items())
                or plural(run.hosts - (killed is not None), "host")
            ),
        )
    )
    return checks


def _claimed_once(seen: _Seen) -> Check:
    twice = sorted(key for key, claims in seen.claims.items() if len(claims) > 1)
    total = sum(len(c) for c in seen.claims.values())
    detail = f"{total:,} claimed targets, {len(twice)} claimed more than once"
    if twice:
        detail += (
            f", e.g. {twice[0][0]} target {twice[0][1]} by hosts {[h for h, _ in seen.claims[twice[0]]]}"
        )
    return Check("every target claimed at most once", not twice, detail)


def _claimed_by_writer(seen: _Seen, targets: list[tuple[Any, ...]], killed: int | None) -> Check:
    """A target out of pending was claimed; a written one was written once, by its claimer (its journal, and
    the host and claim number in the stored result or error, say so); a claimed one is out of pending."""
    problems: list[str] = []
    stored = {(job, idx): status for job, idx, status, _, _ in targets}
    for job, idx, status, result, error in targets:
        key = (job, idx)
        claims = seen.claims.get(key, [])
        writers = [host for host, _ in seen.writes.get(key, [])]
        if status == TargetStatus.PENDING:
            continue
        if not claims:
            if killed is None or status != TargetStatus.RUNNING:  # else the killed host's last claim
                problems.append(f"{job} target {idx} is {status} but no host claimed it")
            continue
        host, number = claims[0]
        if status == TargetStatus.RUNNING:
            continue
        written_by = _writer_named(result, error)
        if written_by != (host, number):
            problems.append(
                f"{job} target {idx} was claimed by host {host} (claim {number}), written by {written_by}"
            )
        if writers != [host] and not (host == killed and writers == []):
            problems.append(
                f"{job} target {idx} was claimed by host {host}, journaled as written by {writers}"
            )
    for key in seen.claims:
        if stored.get(key) == TargetStatus.PENDING:
            problems.append(f"{key[0]} target {key[1]} was claimed but is pending")
    detail = (
        f"{len(targets):,} targets" if not problems else f"{len(problems)} problems, first: {problems[0]}"
    )
    return Check(
        "every target out of pending was claimed, and written once by its claimer", not problems, detail
    )


def _writer_named(result: str | None, error: str | None) -> tuple[int, int] | None:
    if result is not None:
        try:
            page = json.loads(result)
            return int(page["host"]), int(page["claim"])
        except (ValueError, KeyError, TypeError):
            return None
    if error and error.endswith(")") and "(host " in error:
        host, _, claim = error.rpartition("(host ")[2][:-1].partition(", claim ")
        with contextlib.suppress(ValueError):
            return int(host), int(claim)
    return None


def _rescues_were_right(
    seen: _Seen, targets: list[tuple[Any, ...]], jobs: list[tuple[Any, ...]], killed: int | None
) -> Check:
    """A live host never lost a job it was working on, and the killed host owed something on each rescued
    job: a target it claimed (or a claim no journal names) and never wrote, or the job's last write, after
    which it died before it could set the job's final status."""
    owed = _owed_by(killed, seen, targets) if killed is not None else set()
    rescued = [
        job for job, _, _, status, error in jobs if status == JobStatus.FAILED and error == RESCUE_REASON
    ]
    wrong = [job for job in rescued if job not in owed]
    lost = [(host, r) for host, r in seen.lost if host != killed]
    ok = not wrong and not lost
    if ok:
        detail = (
            f"{len(rescued)} rescued jobs in the store, each owed by the killed host; 0 lost by live hosts"
        )
    else:
        detail = f"{len(wrong)} rescued jobs the killed host owed nothing" + (
            f" (e.g. {wrong[0]})" if wrong else ""
        )
        detail += f"; {len(lost)} jobs lost by live hosts" + (
            f" (e.g. host {lost[0][0]}: {lost[0][1]['job']} {lost[0][1]['why']})" if lost else ""
        )
    return Check("no job of a live host failed by the rescue", ok, detail)


def _owed_by(killed: int, seen: _Seen, targets: list[tuple[Any, ...]]) -> set[str]:
    """The jobs the killed host left unfinished: it held a target of the job still running, or it wrote
    the job's last target (by its journal, or a write of a target it claimed that its journal lacks)."""
    owed: set[str] = set()
    unfinished: set[str] = set()
    last: dict[str, tuple[float, int]] = {}  # job -> (time, host) of its latest journaled write
    for job, idx, status, _, _ in targets:
        claims = seen.claims.get((job, idx), [])
        claimer = claims[0][0] if claims else killed  # a claim no journal names is the killed host's
        if status == TargetStatus.RUNNING and claimer == killed:
            owed.add(job)
        elif status in FINAL_TARGET_STATUSES and claimer == killed and not seen.writes.get((job, idx)):
            owed.add(job)  # written, then killed before the record
        if status not in FINAL_TARGET_STATUSES:
            unfinished.add(job)
        for host, at in seen.writes.get((job, idx), []):
            if at > last.get(job, (-1.0, 0))[0]:
                last[job] = (at, host)
    owed.update(
        job
        for job, (_, host) in last.items()
        if host == killed and job not in unfinished and job not in seen.finished
    )
    return owed


def _idempotent(run: HostsRun, seen: _Seen, jobs: list[tuple[Any, ...]]) -> Check:
    """Each answer from the store names a job submitted with the same caller and key; and the store never
    holds two jobs of one (caller, key) that the key would find (queued, running, done or partial)."""
    ids: dict[tuple[str, str], set[str]] = {}
    spec_of = {spec.number: spec for spec in run.specs}
    for spec in run.specs:
        if spec.idem_key:
            ids.setdefault((spec.caller, spec.idem_key), set()).add(job_id_of(run.prefix, spec.number))
    problems: list[str] = []
    hits = 0
    for _, record in seen.submissions:
        spec = spec_of[record["n"]]
        own = job_id_of(run.prefix, spec.number)
        if record["new"]:
            if record["id"] != own:
                problems.append(f"submission {spec.number} created {record['id']}, not {own}")
            continue
        hits += 1
        if record["id"] == own or record["id"] not in ids.get((spec.caller, spec.idem_key), set()):
            problems.append(f"submission {spec.number} was answered with {record['id']}")
    findable: collections.Counter[tuple[str, str]] = collections.Counter(
        (caller, key) for _, caller, key, status, _ in jobs if key and status in IDEM_JOB_STATUSES
    )
    problems += [f"{n} findable jobs of {key}" for key, n in findable.items() if n > 1]
    detail = (
        f"{hits} answered from the store" if not problems else f"{len(problems)} wrong, first: {problems[0]}"
    )
    return Check("every idempotent repeat answered with the same id", not problems, detail)
