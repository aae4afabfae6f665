"""Crash trials: a child process writes large jobs through the store and is killed with SIGKILL at a random
moment; the parent reopens the file and checks everything.

Each trial starts ``python scripts/crash_trials.py --child`` on the same file (so every trial also recovers
the previous trial's crash). The child creates jobs of 20,000 targets (and jobs filled by chunked puts),
writes results (some of 200 kB, some re-written, all non-ASCII, some with NUL), changes statuses, touches,
sweeps and evicts. Before each call it appends a "begin" line to its log, and after the call returns a
"committed" line, each with one unbuffered ``os.write`` (a SIGKILL loses nothing the kernel has; the
trials do not simulate power loss). The parent kills it, then checks:

- ``PRAGMA integrity_check`` is ok (first with plain sqlite3, before the package touches the file);
- no target without its job; a job created with its targets has all ``targets_total`` of them;
- rule 4: ``targets_done`` and ``nbytes`` equal what the target rows give, computed in Python;
- the trigger-kept total equals ``SUM(nbytes)``, and so does ``batch_nbytes()`` after ``open_db``;
- the file holds exactly what the log says: every committed write (replayed on a model of the rules,
  sweeps and evictions included, their returned counts checked), and the write in flight at the kill is
  either wholly there or wholly absent (a sweep or eviction in flight: each job wholly there or absent).

Usage: ``python scripts/crash_trials.py --trials 200 --seed 1``; prints the figures, exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sift import dcache

BIG = 20_000  # targets of a job created with its targets in one call
PUT_TOTAL = 10_000  # targets_total of a job filled by chunked puts
MAX_TARGETS = 100_000  # the child stops creating big jobs while the file holds more targets than this
FINAL = ("done", "failed")
FINISHED_JOBS = ("done", "partial", "failed", "cancelled")
JOB_STATUSES = ("queued", "running", *FINISHED_JOBS)
JOB_COLUMNS = (
    "id", "caller", "caller_class", "idem_key", "status", "error", "targets_total", "targets_done",
    "created_at", "lease", "nbytes",
)  # fmt: skip
PIECES = "aé☃🎉ß'\"\\\x01 "

Op = list[Any]
Query = Callable[[str], Sequence[tuple[Any, ...]]]


# -- The model: what the file must hold after a sequence of writes -----------------------------------------


@dataclass
class JobState:
    fields: dict[str, Any]
    ntargets: int  # targets 0..ntargets-1 are stored
    touched: dict[int, tuple[Any, ...]] = field(default_factory=dict)  # idx -> (status, result, error, hint)


State = dict[str, JobState]


class ModelError(Exception):
    """The log asks for something the rules forbid (a bug in the workload, never in the store)."""


def result_text(spec: list[int] | None) -> str | None:
    """The result a log entry ``[token, size]`` stands for: unique, non-ASCII, sometimes with NUL."""
    if spec is None:
        return None
    token, size = spec
    body = PIECES * (size // len(PIECES) + 1)
    return f"<{token}>" + body[:size]


def utf8(text: str | None) -> int:
    return 0 if text is None else len(text.encode("utf-8"))


def target_url(job_id: str, idx: int) -> str:
    return f"https://crash.test/{job_id}/{idx}"


def apply(state: State, op: Op) -> int | None:
    """Apply one write to the model, as the rules say; return what the call returns."""
    kind = op[0]
    if kind == "create":
        _, job_id, total, ntargets, status, now = op
        fields = dict(
            zip(JOB_COLUMNS, (job_id, "crash", "fleet", "", status, "", total, 0, now, now, 0), strict=True)
        )
        state[job_id] = JobState(fields, ntargets)
    elif kind == "put":
        _, job_id, start, count = op
        if state[job_id].ntargets != start:
            raise ModelError(f"put at {start} into {job_id} holding {state[job_id].ntargets}")
        state[job_id].ntargets += count
    elif kind == "update":
        _, job_id, idx, status, spec, error, hint, now = op
        job = state[job_id]
        old = job.touched.get(idx, ("pending", None, None, None))
        if old[0] in FINAL and status not in FINAL:
            raise ModelError(f"{job_id}/{idx} sent back from {old[0]}")
        result = result_text(spec)
        job.fields["targets_done"] += int(status in FINAL and old[0] not in FINAL)
        job.fields["nbytes"] += utf8(result) - utf8(old[1])
        job.fields["lease"] = now
        job.touched[idx] = (status, result, error, hint)
    elif kind == "status":
        _, job_id, status, error, now = op
        state[job_id].fields.update(status=status, error=error, lease=now)
    elif kind == "touch":
        _, job_id, now = op
        state[job_id].fields["lease"] = now
    elif kind == "sweep":
        _, ttl, now = op
        doomed = [job_id for job_id, job in state.items() if job.fields["lease"] + ttl <= now]
        for job_id in doomed:
            del state[job_id]
        return len(doomed)
    elif kind == "evict":
        _, max_bytes = op
        total = sum(job.fields["nbytes"] for job in state.values())
        candidates = sorted(
            (j.fields["lease"], j.fields["created_at"], j.fields["id"])
            for j in state.values()
            if j.fields["status"] in FINISHED_JOBS and j.fields["nbytes"] > 0
        )
        evicted = 0
        for _, _, job_id in candidates:
            if total <= max_bytes:
                break
            total -= state.pop(job_id).fields["nbytes"]
            evicted += 1
        return evicted
    else:
        raise ModelError(f"unknown op {op!r}")
    return None


def read_state(query: Query) -> tuple[State, list[str]]:
    """The file's content in model form, and every structural problem found on the way."""
    problems: list[str] = []
    state: State = {}
    for row in query(f"SELECT {', '.join(JOB_COLUMNS)} FROM batch_job"):
        state[row[0]] = JobState(dict(zip(JOB_COLUMNS, row, strict=True)), 0)
    for job_id, count, low, high in query(
        "SELECT job_id, COUNT(*), MIN(idx), MAX(idx) FROM batch_target GROUP BY job_id"
    ):
        if job_id not in state:
            problems.append(f"{count} orphan targets of job {job_id!r}")
            continue
        if (low, high) != (0, count - 1):
            problems.append(f"job {job_id!r}: targets are not 0..{count - 1} but {low}..{high}")
        state[job_id].ntargets = count
    for job_id, idx, *rest in query(
        "SELECT job_id, idx, status, result, error, hint FROM batch_target WHERE status != 'pending'"
    ):
        if job_id in state:
            state[job_id].touched[idx] = tuple(rest)
    (bad_pending,) = query(
        "SELECT COUNT(*) FROM batch_target WHERE status = 'pending' "
        "AND (result IS NOT NULL OR error IS NOT NULL OR hint IS NOT NULL)"
    )[0]
    (bad_url,) = query(
        "SELECT COUNT(*) FROM batch_target WHERE url != 'https://crash.test/' || job_id || '/' || idx "
        "OR options != '{\"n\":' || idx || '}'"
    )[0]
    if bad_pending or bad_url:
        problems.append(f"{bad_pending} pending targets with a result, {bad_url} with a wrong url or options")
    return state, problems


# -- The child: writes until it is killed ------------------------------------------------------------------


def child(db_path: str, log_path: str, seed: int) -> int:
    dcache.open_db(db_path)
    state, problems = read_state(lambda sql: dcache.db.execute_sql(sql).fetchall())
    if problems:
        print(f"child: the file is already wrong: {problems}", file=sys.stderr)
        return 4
    rng = random.Random(seed)
    now = max((max(j.fields["lease"], j.fields["created_at"]) for j in state.values()), default=10_000) + 1
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(entry: dict[str, Any]) -> None:
        os.write(fd, (json.dumps(entry) + "\n").encode())

    log({"ready": now})
    for n in range(1_000_000):
        op = choose(state, rng, now, f"{seed}-{n}")
        log({"b": n, "op": op})
        try:
            returned = perform(op)
        except Exception as exc:
            log({"x": n, "error": f"{type(exc).__name__}: {exc}"})
            print(f"child: {op[:2]} raised {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        log({"c": n, "ret": returned})
        expected = apply(state, op)
        if returned != expected:
            print(f"child: {op} returned {returned}, the rules say {expected}", file=sys.stderr)
            return 3
        now += 1
    return 0


def choose(state: State, rng: random.Random, now: int, name: str) -> Op:
    """The next write, picked at random among those the rules allow on the current state."""
    targets = sum(job.ntargets for job in state.values())
    with_targets = [job for job in state.values() if job.ntargets]
    unfilled = [job for job in state.values() if job.ntargets < job.fields["targets_total"]]
    room = targets < MAX_TARGETS
    weights = {
        "big": 2 * room,
        "small": 3,
        "empty": 1 * room,
        "put": 5 * bool(unfilled),
        "update": 30 * bool(with_targets),
        "status": 3 * bool(state),
        "touch": 2 * bool(state),
        "sweep": 3,
        "evict": 3,
    }
    kind = rng.choices(list(weights), list(weights.values()))[0]
    if kind == "big":
        return ["create", f"full-{name}", BIG, BIG, rng.choice(("queued", "running")), now]
    if kind == "small":
        total = rng.randint(1, 50)
        return ["create", f"full-{name}", total, total, rng.choice(JOB_STATUSES), now]
    if kind == "empty":
        return ["create", f"put-{name}", PUT_TOTAL, 0, "running", now]
    if kind == "put":
        job = rng.choice(unfilled)
        left = job.fields["targets_total"] - job.ntargets
        return ["put", job.fields["id"], job.ntargets, min(left, rng.choice((1, 100, 2_500, 5_000)))]
    if kind == "update":
        job = rng.choice(with_targets)
        if job.touched and rng.random() < 0.4:
            idx = rng.choice(sorted(job.touched))
        else:
            idx = rng.randrange(job.ntargets)
        old = job.touched.get(idx, ("pending",))[0]
        status = "running" if old not in FINAL and rng.random() < 0.2 else rng.choice(FINAL)
        if status == "running":
            return ["update", job.fields["id"], idx, status, None, None, None, now]
        size = rng.choice(
            (rng.randint(0, 300), rng.randint(0, 300), rng.randint(0, 20_000), rng.randint(0, 200_000))
        )
        spec = [rng.randrange(10**9), size] if rng.random() < 0.9 else None
        error = f"error {rng.randrange(1000)} é" if status == "failed" else None
        return ["update", job.fields["id"], idx, status, spec, error, rng.choice((None, "hint\x01")), now]
    if kind == "status":
        job_id = rng.choice(sorted(state))
        return ["status", job_id, rng.choice(JOB_STATUSES), rng.choice(("", "boom ☃")), now]
    if kind == "touch":
        return ["touch", rng.choice(sorted(state)), now]
    if kind == "sweep":
        return ["sweep", rng.randint(5, 300), now]
    total = sum(job.fields["nbytes"] for job in state.values())
    return ["evict", rng.randint(0, max(total, 0))]


def _targets(job_id: str, start: int, count: int) -> Iterator[dcache.BatchTarget]:
    """The targets, streamed (``from_row`` skips Peewee's slow per-field ``__init__``, as for 20,000 of them
    that would take longer than the store's insert)."""
    names = ("idx", "url", "options")
    for idx in range(start, start + count):
        yield dcache.BatchTarget.from_row(names, (idx, target_url(job_id, idx), f'{{"n":{idx}}}'))


def perform(op: Op) -> Any:
    """Make the write ``op`` through the package; return what the call returned."""
    kind = op[0]
    if kind == "create":
        _, job_id, total, ntargets, status, now = op
        job = dcache.BatchJob(
            id=job_id, caller="crash", caller_class="fleet", idem_key="", status=status,
            targets_total=total, created_at=now, lease=now,
        )  # fmt: skip
        return dcache.create_batch_job(job, _targets(job_id, 0, ntargets) if ntargets else None)
    if kind == "put":
        _, job_id, start, count = op
        return dcache.put_batch_targets(job_id, _targets(job_id, start, count))
    if kind == "update":
        _, job_id, idx, status, spec, error, hint, now = op
        return dcache.update_batch_target(
            job_id, idx, status, result=result_text(spec), error=error, hint=hint, now=now
        )
    if kind == "status":
        _, job_id, status, error, now = op
        return dcache.set_batch_job_status(job_id, status, error, now=now)
    if kind == "touch":
        return dcache.touch_batch_job(op[1], now=op[2])
    if kind == "sweep":
        return dcache.sweep_batch(op[1], now=op[2])
    return dcache.evict_batch_oldest(op[1])


# -- The parent: start, kill, check ------------------------------------------------------------------------


@dataclass
class Summary:
    seed: int
    trials: int = 0
    kills: int = 0
    writes_verified: int = 0
    killed_in: Counter[str] = field(default_factory=Counter)  # the write in flight at the kill -> outcome
    kill_modes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    max_jobs: int = 0
    max_targets: int = 0
    max_file_mb: float = 0.0
    elapsed_s: float = 0.0

    def report(self) -> str:
        kinds: dict[str, list[str]] = {}
        for key, count in sorted(self.killed_in.items()):
            kind, _, outcome = key.partition(": ")
            kinds.setdefault(kind, []).append(f"{outcome} {count}" if outcome else str(count))
        inside = "".join(f"\n  {kind}: {', '.join(outcomes)}" for kind, outcomes in kinds.items())
        modes = ", ".join(f"{mode} {count}" for mode, count in sorted(self.kill_modes.items()))
        return "\n".join(
            (
                f"crash trials: {self.trials} (seed {self.seed}), SIGKILLs: {self.kills}, "
                f"committed writes verified: {self.writes_verified}, failures: {len(self.failures)}",
                f"kills timed: {modes}",
                f"killed inside (the write in flight, and what the file held of it):{inside}",
                f"largest state: {self.max_jobs} jobs, {self.max_targets} targets, "
                f"{self.max_file_mb:.1f} MB file",
                f"elapsed: {self.elapsed_s:.1f} s",
                *(f"FAILURE: {failure}" for failure in self.failures),
            )
        )


def read_log(path: Path) -> list[dict[str, Any]]:
    entries = []
    if path.exists():
        for line in path.read_bytes().splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:  # only a line cut by the kill could be partial; its write is then in flight
                break
    return entries


def describe(op: Op) -> str:
    """The kind of write, for the figures."""
    if op[0] == "create":
        return (
            f"create with {BIG} targets"
            if op[3] == BIG
            else "create with 1-50 targets"
            if op[3]
            else "create, empty"
        )
    if op[0] == "put":
        return "put of 1-5000 targets"
    return str(op[0])


def check_file(path: Path, before: State, log: list[dict[str, Any]], trial: int, summary: Summary) -> State:
    """Check the killed child's file against the model; return the file's (checked) state."""
    failures: list[str] = []
    model = copy.deepcopy(before)
    pending: Op | None = None
    for entry in log:
        if "b" in entry:
            pending = entry["op"]
        elif "c" in entry and pending is not None:
            expected = apply(model, pending)
            if entry["ret"] != expected:
                failures.append(f"{pending[:3]} returned {entry['ret']}, the rules say {expected}")
            summary.writes_verified += 1
            pending = None
        elif "x" in entry:
            failures.append(f"the child's write raised {entry['error']}")
            pending = None
    after = copy.deepcopy(model)
    if pending is not None:
        apply(after, pending)

    # First with plain sqlite3, before the package (whose open_db recomputes the byte total) touches it.
    conn = sqlite3.connect(path, isolation_level=None)
    try:

        def query(sql: str) -> list[tuple[Any, ...]]:
            return conn.execute(sql).fetchall()

        integrity = query("PRAGMA integrity_check")
        tables = {name for (name,) in query("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if integrity != [("ok",)] or not tables >= {"batch_job", "batch_target", "batch_totals"}:
            # A kill inside the very first open_db may leave a file without the schema, and nothing else.
            if integrity != [("ok",)] or tables or model:
                summary.failures.append(
                    f"trial {trial}: integrity_check {integrity[:5]}, tables {sorted(tables)}"
                )
            return model
        state, problems = read_state(query)
        failures += problems
        (total,) = query("SELECT nbytes FROM batch_totals WHERE id = 0")[0]
        (summed,) = query("SELECT COALESCE(SUM(nbytes), 0) FROM batch_job")[0]
        if total != summed:
            failures.append(f"batch_totals holds {total}, SUM(nbytes) is {summed}")
        results = query("SELECT job_id, status, result FROM batch_target WHERE status != 'pending'")
    finally:
        conn.close()

    # Rule 4, computed in Python from the target rows.
    done: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    for job_id, status, result in results:
        done[job_id] += status in FINAL
        nbytes[job_id] += utf8(result)
    for job_id, job in state.items():
        counted = (job.fields["targets_done"], job.fields["nbytes"])
        if counted != (done[job_id], nbytes[job_id]):
            failures.append(
                f"job {job_id!r} says (targets_done, nbytes) = {counted}, "
                f"its targets give {(done[job_id], nbytes[job_id])}"
            )
        total = job.fields["targets_total"]
        if job_id.startswith("full-") and job.ntargets != total:
            failures.append(f"job {job_id!r} holds {job.ntargets} of the {total} targets it was created with")

    # Every committed write is there; the one in flight is wholly there or wholly absent, job by job.
    as_before = as_after = 0
    for job_id in set(model) | set(after) | set(state):
        found = state.get(job_id)
        if found == model.get(job_id):
            as_before += model.get(job_id) != after.get(job_id)
        elif found == after.get(job_id):
            as_after += 1
        else:
            failures.append(
                f"job {job_id!r} in the file is {_brief(found)}; the log says {_brief(model.get(job_id))}"
                + (
                    f" or, with the write in flight, {_brief(after.get(job_id))}"
                    if pending is not None
                    else ""
                )
            )
    if pending is None:
        summary.killed_in["between writes"] += 1
    else:
        outcome = (
            "partly, each job whole" if as_after and as_before else "all there" if as_after else "none there"
        )
        summary.killed_in[f"{describe(pending)}: {outcome}"] += 1

    # The package's own view after reopening: the recomputed byte total must agree.
    dcache.open_db(path)
    try:
        if dcache.batch_nbytes() != sum(job.fields["nbytes"] for job in state.values()):
            failures.append(f"batch_nbytes() {dcache.batch_nbytes()} != SUM(nbytes)")
    finally:
        dcache.close_db()

    summary.failures += [f"trial {trial}: {failure}" for failure in failures]
    summary.max_jobs = max(summary.max_jobs, len(state))
    summary.max_targets = max(summary.max_targets, sum(job.ntargets for job in state.values()))
    summary.max_file_mb = max(summary.max_file_mb, path.stat().st_size / 1e6)
    return state


def _brief(job: JobState | None) -> str:
    if job is None:
        return "absent"
    return f"{job.fields} with {job.ntargets} targets, {len(job.touched)} written"


def wait_for(log: Path, proc: subprocess.Popen[bytes], marker: bytes, timeout: float = 60.0) -> bool:
    """Wait until the child's log holds ``marker`` (polled every millisecond)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and marker in log.read_bytes():
            return True
        time.sleep(0.001)
    return False


def run_trials(trials: int, seed: int, workdir: Path, max_delay: float = 0.6, quiet: bool = True) -> Summary:
    """Run ``trials`` kill trials on one file in ``workdir``; every trial also recovers the previous crash."""
    started = time.monotonic()
    rng = random.Random(seed)
    summary = Summary(seed=seed)
    path = workdir / "crash.db"
    state: State = {}
    for trial in range(trials):
        log, err = workdir / f"trial-{trial}.log", workdir / f"trial-{trial}.err"
        with err.open("wb") as err_file:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    "--db",
                    str(path),
                    "--log",
                    str(log),
                    "--seed",
                    str(rng.randrange(10**9)),
                ],
                stdout=err_file,
                stderr=err_file,
            )
            # Where the kill lands: at a random time (so mostly inside the long writes), right after a
            # random write began (so inside any kind of write), or during start-up and open_db.
            mode = rng.choices(("time", "write", "start"), (45, 45, 10))[0]
            summary.kill_modes[mode] += 1
            if mode == "start":
                time.sleep(rng.uniform(0.0, 0.4))
            elif not wait_for(
                log, proc, b'{"ready"' if mode == "time" else b'{"b": %d,' % rng.randrange(100)
            ):
                summary.failures.append(f"trial {trial}: the child stopped early: {err.read_text()[-2000:]}")
            elif mode == "time":
                time.sleep(rng.uniform(0.0, max_delay))
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        summary.trials += 1
        if proc.returncode == -signal.SIGKILL:
            summary.kills += 1
        else:
            summary.failures.append(
                f"trial {trial}: the child exited {proc.returncode}: {err.read_text()[-2000:]}"
            )
        if path.exists():
            state = check_file(path, state, read_log(log), trial, summary)
        if not quiet:
            print(
                f"trial {trial}: {len(state)} jobs, {summary.writes_verified} writes verified so far",
                flush=True,
            )
    summary.elapsed_s = time.monotonic() - started
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=25)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--max-delay", type=float, default=0.6, help="latest kill, seconds after the child is ready"
    )
    parser.add_argument(
        "--dir", type=Path, help="keep the file and logs here (default: a temporary directory)"
    )
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.db, args.log, args.seed)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        summary = run_trials(args.trials, args.seed, args.dir, args.max_delay, quiet=not args.verbose)
    else:
        with tempfile.TemporaryDirectory(prefix="crash-trials-") as tmp:
            summary = run_trials(args.trials, args.seed, Path(tmp), args.max_delay, quiet=not args.verbose)
    print(summary.report())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
