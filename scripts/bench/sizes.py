"""The sizes and repeat counts of a run (full, or quick for CI), and the facts every fixture shares."""

from __future__ import annotations

from dataclasses import dataclass

#: The start of the fixtures' clock: leases and created_at count up from here.
T0 = 1_700_000_000
#: A byte budget no fixture reaches: evict_batch_oldest(BUDGET) is a no-op.
BUDGET = 10**15
OPTIONS = '{"render":false}'
#: The runner's result: 1 KB of ASCII.
RESULT_1K = "r" * 1024
#: Statuses of the retained finished jobs, in turn.
FINISHED = ("done", "partial", "failed", "cancelled")


@dataclass(frozen=True)
class Sizes:
    """Every size and repeat count of one run."""

    flat_small: int  # retained finished jobs, small store
    flat_large: int  # retained finished jobs, large store
    targets_per_job: int  # targets of each retained job
    retained_result: int  # bytes of each retained target's result
    flat_rounds: int  # rounds; each opens each store once
    flat_batches: int  # timed batches per case, round and store
    flat_ops: int  # calls per batch
    warmup: int  # untimed calls per case after each open
    raw_rounds: int  # rounds of the runner-step and submit comparisons
    raw_ops: int  # runner steps per batch (submit: a tenth of it)
    # SQLite's runner steps per batch: enough that each batch holds many checkpoints (one per 1,000 -wal
    # frames, about 130 steps), so that how many fall in a batch does not decide its mean
    runner_ops: int
    submit_targets: int  # targets of each submitted job
    put_targets: int  # targets of one put_batch_targets
    put_rounds: int  # puts per side
    read_targets: int  # targets of the job that batch_targets reads
    read_result: int  # bytes of each of its results
    read_rounds: int
    read_ops: int
    sweep_jobs: int  # expired jobs to sweep, and again jobs to evict
    sweep_targets: int  # targets of each of them
    sweep_result: int  # bytes of each of their results
    rss_targets: int  # targets put from a generator in the memory case
    plugin_tests: int  # tests of each pytest run in the testing case
    plugin_rounds: int  # pytest runs of each side
    hooks_threads: int  # request threads of the hooks case
    ops_small: int  # jobs of the small store in the ops case (3 targets each)
    ops_large: int  # jobs of the large store
    ops_result: int  # bytes of each target's result there
    ops_opens: int  # timed open_db calls per store
    ops_checks: int  # timed check_store runs and GROUP BY passes
    hooks_requests: int  # requests per thread in each batch
    hooks_rounds: int  # batches of each side
    disk_jobs: int  # finished jobs of the disk case, 90% of them evicted
    writer_procs: int  # PostgreSQL: processes writing target results at once
    writer_ops: int  # writes of each process in one round
    writer_rounds: int  # rounds of each side (1 process, writer_procs processes)
    claim_ops: int  # claim_batch_targets calls of each process in one round
    claim_rounds: int  # rounds of each side (1, 2 and 4 processes)
    fair_pending: int  # pending targets of the fair claim's large store (the small one: 1,000)
    fair_rounds: int  # rounds of each side (small and large store), each with and without per_host
    fair_claims: int  # timed claims of each side in one round
    sim_jobs: int  # PostgreSQL: submissions of each sift simulate --hosts run
    sim_rounds: int  # runs of each side (--hosts 1, --hosts 4)
    sim_fetch_jobs: int  # the same with fetches that wait on the network (--fetch-ms)
    flood_jobs: int  # fairness: submissions of each sift simulate --workload flood run (half the flood's)
    flood_targets: int  # fairness: targets of each flood job
    flood_rounds: int  # fairness: runs of each side (fair, oldest first)
    tail_rounds: int  # SQLite tail: rounds of each side
    wait_rounds: int  # waits ended by another process's write, each timed from that write's commit
    page_small: int  # targets of the small job whose pages are read
    page_large: int  # targets of the large job
    instruction_steps: int  # calls counted by callgrind in each side's long run
    instruction_paths: bool  # count the claim, the write of ten, the no-op sweep and eviction too
    web_jobs: int  # jobs in the store the dashboard's pages read
    runner_targets: int  # targets of the batch a Runner stores against huey
    runner_rounds: int  # rounds of that comparison at each setting
    contention_targets: int  # targets of the job read, written and run beside a computing thread
    contention_rounds: int  # rounds of each side there
    tail_calls: int  # calls of each process in one round
    compare_rounds: int  # --compare-with: rounds (even: each side goes first as often)
    compare_ops: int  # calls of each case per side and round


FULL = Sizes(
    flat_small=1_000,
    flat_large=100_000,
    targets_per_job=10,
    retained_result=1024,
    flat_rounds=5,
    flat_batches=4,
    flat_ops=200,
    warmup=100,
    raw_rounds=10,
    raw_ops=200,
    runner_ops=2_000,
    submit_targets=100,
    put_targets=100_000,
    put_rounds=5,
    read_targets=10_000,
    read_result=64,
    read_rounds=7,
    read_ops=3,
    sweep_jobs=10_000,
    sweep_targets=100,
    sweep_result=1024,
    rss_targets=1_000_000,
    plugin_tests=1_000,
    plugin_rounds=7,
    hooks_threads=8,
    hooks_requests=250,
    hooks_rounds=9,
    ops_small=1_000,
    ops_large=1_000_000,
    ops_result=300,
    ops_opens=41,
    ops_checks=3,
    disk_jobs=10_000,
    writer_procs=8,
    writer_ops=500,
    writer_rounds=5,
    claim_ops=300,
    claim_rounds=5,
    fair_pending=1_000_000,
    fair_rounds=4,
    fair_claims=200,
    sim_jobs=300,
    sim_rounds=2,
    sim_fetch_jobs=150,
    flood_jobs=40,
    flood_targets=500,
    flood_rounds=2,
    tail_rounds=8,
    wait_rounds=50,
    page_small=1_000,
    page_large=1_000_000,
    instruction_steps=200,
    instruction_paths=True,
    web_jobs=100_000,
    runner_targets=1_000,
    runner_rounds=5,
    contention_targets=1_000,
    contention_rounds=5,
    tail_calls=600,
    compare_rounds=30,
    compare_ops=200,
)

QUICK = Sizes(
    flat_small=100,
    flat_large=2_000,
    targets_per_job=10,
    retained_result=64,
    flat_rounds=2,
    flat_batches=2,
    flat_ops=50,
    warmup=10,
    raw_rounds=3,
    raw_ops=50,
    runner_ops=50,
    submit_targets=100,
    put_targets=5_000,
    put_rounds=2,
    read_targets=1_000,
    read_result=64,
    read_rounds=2,
    read_ops=2,
    sweep_jobs=200,
    sweep_targets=20,
    sweep_result=64,
    rss_targets=20_000,
    plugin_tests=100,
    plugin_rounds=2,
    hooks_threads=8,
    hooks_requests=20,
    hooks_rounds=2,
    ops_small=100,
    ops_large=2_000,
    ops_result=64,
    ops_opens=5,
    ops_checks=1,
    disk_jobs=200,
    writer_procs=8,
    writer_ops=40,
    writer_rounds=2,
    claim_ops=20,
    claim_rounds=1,
    fair_pending=20_000,
    fair_rounds=2,
    fair_claims=10,
    sim_jobs=30,
    sim_rounds=1,
    sim_fetch_jobs=12,
    flood_jobs=8,
    flood_targets=300,
    flood_rounds=1,
    tail_rounds=2,
    wait_rounds=5,
    page_small=1_000,
    page_large=20_000,
    instruction_steps=10,
    instruction_paths=False,
    web_jobs=2_000,
    runner_targets=100,
    runner_rounds=1,
    contention_targets=100,
    contention_rounds=1,
    tail_calls=60,
    compare_rounds=4,
    compare_ops=50,
)
