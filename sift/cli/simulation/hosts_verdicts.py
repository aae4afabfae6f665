"""The end check of ``sift simulate --hosts``: the store against the hosts' journals, and ``check_store``."""

from __future__ import annotations

import collections
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from sift import dcache
from sift.dcache import BatchJob, BatchTarget, JobStatus, TargetStatus
from sift.dcache.models import IDEM_JOB_STATUSES

from ..report import plural
from .coordinator import STALL_S, HostsRun
from .host import MAX_ATTEMPTS, STALE_REASON, job_id_of
from .verdicts import Check, store_checks

__all__ = ["check_run"]


@dataclass
class _Seen:
    """The journals, indexed."""

    #: -> (host, claim), in the order they were claimed (a journal's time is the machine's monotonic clock)
    claims: dict[tuple[str, int], list[tuple[int, int]]] = field(default_factory=dict)
    writes: dict[tuple[str, int], list[tuple[int, float]]] = field(default_factory=dict)  # -> (host, t)
    submissions: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    lost: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    requeued: int = 0  # targets the keepers put back to pending
    failed_stale: int = 0  # targets the keepers failed at their last attempt
    finished: set[str] = field(default_factory=set)  # jobs some host set a final status of

    @classmethod
    def of(cls, journals: dict[int, list[dict[str, Any]]]) -> _Seen:
        seen = cls()
        claimed: dict[tuple[str, int], list[tuple[float, int, int]]] = {}
        for host, records in journals.items():
            for r in records:
                if r["k"] == "claim":
                    for job, idx in r["got"]:
                        claimed.setdefault((job, idx), []).append((r["t"], host, r["c"]))
                elif r["k"] == "done":
                    seen.writes.setdefault((r["job"], r["idx"]), []).append((host, r["t"]))
                elif r["k"] == "sub":
                    seen.submissions.append((host, r))
                elif r["k"] == "lost":
                    seen.lost.append((host, r))
                elif r["k"] == "finish":
                    seen.finished.add(r["job"])
                elif r["k"] == "requeue":
                    seen.requeued += r["n"]
                    seen.failed_stale += r["failed"]
        seen.claims = {key: [(host, c) for _, host, c in sorted(claims)] for key, claims in claimed.items()}
        return seen


def check_run(run: HostsRun, budget: int) -> list[Check]:
    """The end check, from the store and the journals alone (the store must be open)."""
    seen = _Seen.of(run.journals)
    killed = run.kill.host if run.kill else None
    J, T = BatchJob, BatchTarget
    mine = f"{run.prefix}-"
    target_rows: Any = T.select(T.job_id, T.idx, T.status, T.result, T.error, T.attempts).where(
        T.job_id.startswith(mine)
    )
    job_rows: Any = J.select(J.id, J.caller, J.idem_key, J.status, J.error).where(J.id.startswith(mine))
    targets: list[tuple[Any, ...]] = list(target_rows.tuples())
    jobs: list[tuple[Any, ...]] = list(job_rows.tuples())
    checks = [_claims_exact(seen, targets, killed), _claimed_by_writer(seen, targets, killed)]
    checks += store_checks(dcache.check_store(), budget, whole=True)
    checks.append(_requeues_right(seen, targets, jobs, killed))
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


def _claims_exact(seen: _Seen, targets: list[tuple[Any, ...]], killed: int | None) -> Check:
    """Each stored target's ``attempts`` is the number of claims the journals record of it (the killed
    host's last claim may be missing from its journal: one, at most); and every claim a later one
    superseded (any but the one its stored write names, else its latest) was the killed host's: a live host
    renews its claims, so none of them may go stale (one that did had its write refused, ``ClaimLost``, but
    ``stale_after`` is then too short for the renewals)."""
    problems: list[str] = []
    holders: dict[tuple[str, int], tuple[int, int]] = {}
    for job, idx, _, result, error, attempts in targets:
        claims = seen.claims.get((job, idx), [])
        unnamed = attempts - len(claims)
        if not (unnamed == 0 or (unnamed == 1 and killed is not None)):
            problems.append(f"{job} target {idx} has {attempts} attempts, {len(claims)} claims journaled")
        if (written_by := _writer_named(result, error)) in claims:
            holders[(job, idx)] = written_by
    for (job, idx), claims in seen.claims.items():
        holder = holders.get((job, idx), claims[-1])
        for host, number in claims:
            if (host, number) != holder and host != killed:
                held = [h for h, _ in claims]
                problems.append(
                    f"{job} target {idx} claimed by hosts {held}: host {host} lived, its claim went stale"
                )
    total = sum(len(c) for c in seen.claims.values())
    again = sum(len(c) - 1 for c in seen.claims.values())
    detail = f"{total:,} claims journaled, {again} of a target claimed before"
    if problems:
        detail = f"{len(problems)} problems, first: {problems[0]}"
    return Check("no target held by two runners at once; each attempt claimed once", not problems, detail)


def _claimed_by_writer(seen: _Seen, targets: list[tuple[Any, ...]], killed: int | None) -> Check:
    """A target out of pending was claimed; a written one was written once, by its claimer (its journal, and
    the host and claim number in the stored result or error, say so); a claimed one is out of pending."""
    problems: list[str] = []
    stored = {(job, idx): status for job, idx, status, *_ in targets}
    for job, idx, status, result, error, attempts in targets:
        key = (job, idx)
        claims = seen.claims.get(key, [])
        writers = [host for host, _ in seen.writes.get(key, [])]
        if status == TargetStatus.PENDING:
            continue
        if status == TargetStatus.FAILED and error == STALE_REASON:  # failed by a requeue: nobody wrote it
            if writers:
                problems.append(f"{job} target {idx} failed stale, but journaled as written by {writers}")
            continue
        if len(claims) < attempts:  # its last claim is the killed host's, which died before the record
            claims = [*claims, (killed if killed is not None else -1, -1)]
        if not claims:
            problems.append(f"{job} target {idx} is {status} but no host claimed it")
            continue
        written_by = _writer_named(result, error)
        # The claim that holds it: the one its write names, else the latest (any other one went stale).
        host, number = written_by if written_by in claims else claims[-1]
        if status == TargetStatus.RUNNING:
            continue
        if written_by != (host, number) and not (number == -1 and written_by and written_by[0] == host):
            problems.append(
                f"{job} target {idx} was claimed by host {host} (claim {number}), written by {written_by}"
            )
        if writers != [host] and not (host == killed and writers == []):
            problems.append(
                f"{job} target {idx} was claimed by host {host}, journaled as written by {writers}"
            )
    for key, claims in seen.claims.items():
        if stored.get(key) == TargetStatus.PENDING and any(host != killed for host, _ in claims):
            problems.append(f"{key[0]} target {key[1]} was claimed by a live host but is pending")
    detail = (
        f"{len(targets):,} targets" if not problems else f"{len(problems)} problems, first: {problems[0]}"
    )
    return Check(
        "every target out of pending was claimed, and written once by its last claimer", not problems, detail
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


def _requeues_right(
    seen: _Seen, targets: list[tuple[Any, ...]], jobs: list[tuple[Any, ...]], killed: int | None
) -> Check:
    """Every job finished; no target failed stale while ``MAX_ATTEMPTS`` allowed another attempt (one host
    killed takes one attempt from each target it held); no live host lost a job; and what the keepers
    recorded covers what the stored targets show: each attempt beyond a target's last was a requeue."""
    problems: list[str] = []
    live = [
        job
        for job, _, _, status, _ in jobs
        if status not in (JobStatus.DONE, JobStatus.PARTIAL, JobStatus.FAILED)
    ]
    if live:
        problems.append(f"{len(live)} jobs not finished (e.g. {live[0]})")
    stale = [
        (job, idx)
        for job, idx, status, _, error, _ in targets
        if status == TargetStatus.FAILED and error == STALE_REASON
    ]
    if stale and (killed is not None) < MAX_ATTEMPTS:
        problems.append(f"{len(stale)} targets failed stale with attempts left (e.g. {stale[0]})")
    requeued = sum(
        attempts - (status != TargetStatus.PENDING)
        for _, _, status, _, error, attempts in targets
        if attempts and not (status == TargetStatus.FAILED and error == STALE_REASON)
    ) + sum(attempts - 1 for *_, error, attempts in targets if error == STALE_REASON)
    if requeued > seen.requeued or len(stale) > seen.failed_stale:
        problems.append(
            f"the stored targets show {requeued} requeued and {len(stale)} failed stale, the keepers "
            f"recorded {seen.requeued} and {seen.failed_stale}"
        )
    lost = [(host, r) for host, r in seen.lost if host != killed]
    if lost:
        problems.append(f"{len(lost)} jobs lost by live hosts (e.g. host {lost[0][0]}: {lost[0][1]['job']})")
    detail = (
        f"{len(jobs)} stored jobs finished; {plural(seen.requeued, 'target')} requeued, "
        f"{seen.failed_stale} failed stale"
        if not problems
        else f"{len(problems)} problems, first: {problems[0]}"
    )
    return Check(
        "every job finished, none failed by a requeue, and every requeue recorded", not problems, detail
    )


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
