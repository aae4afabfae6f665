"""Benchmark of the batch store's hot paths: flat in history, close to raw SQLite, short lock holds,
bounded memory and disk; and on PostgreSQL: flat in history, close to plain psycopg, writes from several
processes, lock waits.

    python scripts/bench                   # full run: SQLite, then PostgreSQL when the test server answers
    python scripts/bench --quick           # small sizes: keeps the bench working in CI
    python scripts/bench --json out.json
    python scripts/bench --db sqlite --db postgresql://user@host:5432/db   # exactly these stores
    python scripts/bench --compare-with main   # the hot paths of this tree against main's, side by side

Every fixture is a real SQLite file in WAL mode, built in a temporary directory. Fixture building is
not timed. Each timed case runs in batches of calls; a batch gives one figure, µs per call, and the
table shows the median over all batches. The two sides of a ratio (N=1k and N=100k, or the package and
its plain ``sqlite3`` baseline) run interleaved, batch by batch, so that drift in the machine hits both.

Lock holds are measured by wrapping ``db.lock`` in a timing proxy for the sweep and eviction cases only
(the package is not changed); the reader thread's latencies are measured around each ``batch_job`` call.
The disk group evicts 90% of a store of results on a new (incremental auto-vacuum) file and compares the
file's size with its pages in use, timing db.lock the same way; it also times a backup_store of that
store with the reader polling. Peak RSS is measured in a fresh subprocess (VmHWM). Goals are printed as
PASS/FAIL lines. The exit status is 0 whatever the figures (``--check`` makes a failed goal exit 1): the
suite never asserts on time.

On PostgreSQL each group builds its store in a fresh schema of its own (``sift_bench_<pid>_<random>_<group>``)
and drops it when done; see docs/explanation/performance.md for what each ``pg/`` case runs.

``--compare-with REV`` checks git revision REV out into a temporary worktree and times the hot paths
(the runner step, a claim, a no-op sweep, a no-op eviction) of this tree's ``sift`` and of REV's, each in a
process of its own, on identical stores, batch by batch in alternating order; the case code is this tree's
and calls only ``sift.dcache``'s public API, so REV needs no bench of its own.

Modules: ``harness`` (timing, interleaving, cases, goals, reports), ``sizes``, ``stores`` (SQLite and
PostgreSQL), ``fixtures`` (stores built in bulk), ``cases/<group>``, ``compare`` and ``side`` (the two
sides of a comparison), ``cli``.
"""
