-- The SQLite store's schema. Every statement is idempotent: open_db runs the lot on a store that lacks any part.
-- Loaded by schema.py; the schema check reads the names it creates from here too.

-- name: base
-- The original schema, verbatim: files written by the Go service have exactly these tables.
CREATE TABLE IF NOT EXISTS batch_job (
    id TEXT PRIMARY KEY, caller TEXT NOT NULL, caller_class TEXT NOT NULL, idem_key TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', targets_total INTEGER NOT NULL,
    targets_done INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, lease INTEGER NOT NULL,
    nbytes INTEGER NOT NULL DEFAULT 0);

CREATE TABLE IF NOT EXISTS batch_target (
    job_id TEXT NOT NULL, idx INTEGER NOT NULL, url TEXT NOT NULL, options TEXT NOT NULL,
    status TEXT NOT NULL, result TEXT, error TEXT, hint TEXT, PRIMARY KEY (job_id, idx));

CREATE INDEX IF NOT EXISTS batch_job_idem  ON batch_job(caller, idem_key);

CREATE INDEX IF NOT EXISTS batch_job_lease ON batch_job(lease);

-- name: speed
-- What the hot paths need to stay flat in history. The partial indexes hold only live jobs, or only jobs
-- that eviction may take. A write that changes a job's lease, bytes or status tests its row against each
-- partial index over those columns; SQLite tests an IN list of more than two values through a temporary
-- table it builds on every such write (each result write), so the finished statuses are ORed. open_db
-- makes again an index of this section whose stored definition differs (an earlier version's IN list).
CREATE INDEX IF NOT EXISTS batch_job_live ON batch_job(caller) WHERE status IN ('queued', 'running');

CREATE INDEX IF NOT EXISTS batch_job_evictable ON batch_job(lease, created_at, id) WHERE nbytes > 0 AND (status = 'done' OR status = 'partial' OR status = 'failed' OR status = 'cancelled');

-- name: claims
-- claim_batch_targets: live jobs in claim order (created_at, then rowid, which every index entry ends
-- with), and each job's pending targets (batch_target_host), so a claim reads neither history nor done
-- targets.
-- rescue_stale_jobs reads batch_job_claim too (every live job, checking its lease), never batch_job_lease,
-- which holds the history as well. A read-only open may lack these: claims, rescues and the claims'
-- renewals, releases and requeues (writes) need them; a read of running targets scans without them.
CREATE INDEX IF NOT EXISTS batch_job_claim ON batch_job(created_at) WHERE status IN ('queued', 'running');

-- Version 4: the claim's ring walks the callers with a live job in name order, and each caller's live jobs
-- in claim order, and a claim takes a job's pending targets host by host, then by idx (with a per-host
-- limit, a skip scan over the hosts). It is the one index of pending targets, which every submit, claim
-- and result write moves. The ring's cursor is one row: the caller served last and the turns it has used.
CREATE INDEX IF NOT EXISTS batch_job_ring ON batch_job(caller, created_at) WHERE status IN ('queued', 'running');

CREATE INDEX IF NOT EXISTS batch_target_host ON batch_target(job_id, host, idx) WHERE status = 'pending' AND not_before IS NULL;

-- Version 9: a retried target waits, pending, until its not_before; it stays out of batch_target_host until
-- then, so waiting targets cost a claim nothing. Each claim first moves the targets that have come due back
-- (not_before = NULL), read through this index of the waiting ones by time.
CREATE INDEX IF NOT EXISTS batch_target_delayed ON batch_target(not_before) WHERE not_before IS NOT NULL;

-- Version 10: the pending targets by host and not_before, which only back_off_host and release_host read: a
-- host backed off moves its claimable targets out of batch_target_host (not_before = the back-off's last
-- second) and back, reading only those it moves.
CREATE INDEX IF NOT EXISTS batch_target_pending_host ON batch_target(host, not_before) WHERE status = 'pending';

-- The running targets, by the runner that holds them: renew_claims, release_claims and
-- requeue_stale_claims read only these, never history.
CREATE INDEX IF NOT EXISTS batch_target_running ON batch_target(runner) WHERE status = 'running';

CREATE TABLE IF NOT EXISTS batch_claim_ring (id INTEGER PRIMARY KEY CHECK (id = 0), caller TEXT, turns INTEGER NOT NULL);

INSERT OR IGNORE INTO batch_claim_ring (id, caller, turns) VALUES (0, NULL, 0);

-- name: pacing
-- Version 8: politeness. A host's policy (NULL: the default's, the row of host '*'; milliseconds for the
-- interval and times), when the host is next due (pacing) and backed off until, one row a host the
-- operator named or a claim paced; and the paused jobs and callers, whose targets no claim takes. Tables
-- of their own: the original service's tables and statements stay as they were.
CREATE TABLE IF NOT EXISTS batch_host_policy (host TEXT PRIMARY KEY, max_running INTEGER, min_interval_ms INTEGER, next_due_ms INTEGER NOT NULL DEFAULT 0, backed_off_until_ms INTEGER NOT NULL DEFAULT 0);

CREATE TABLE IF NOT EXISTS batch_paused_job (job_id TEXT PRIMARY KEY, paused_at INTEGER NOT NULL);

CREATE TABLE IF NOT EXISTS batch_paused_caller (caller TEXT PRIMARY KEY, paused_at INTEGER NOT NULL);

-- name: retired
-- Indexes earlier versions made, dropped at open: every result write moved their entries, and nothing
-- reads them any more. batch_job_live_lease: a live job's lease changes on each write. batch_target_pending
-- (a job's pending targets by idx): claims read batch_target_host alone since version 5.
DROP INDEX IF EXISTS batch_job_live_lease;

DROP INDEX IF EXISTS batch_target_pending;

-- name: claim_columns
-- Version 3: a claim's runner, its heartbeat (unix seconds) and how many times the target was claimed, as
-- columns of the target with SQL-side defaults, so a program that names its columns (the original service)
-- still inserts and reads targets. Added by open_db when missing (SQLite has no ADD COLUMN IF NOT EXISTS).
ALTER TABLE batch_target ADD COLUMN runner TEXT;

ALTER TABLE batch_target ADD COLUMN heartbeat INTEGER;

ALTER TABLE batch_target ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;

-- name: host_column
-- Version 4: the target's host (url_host(url)), which per-host claim limits count; open_db fills it in for
-- the targets already stored. A program that does not know it inserts '' (one host for all its targets).
ALTER TABLE batch_target ADD COLUMN host TEXT NOT NULL DEFAULT '';

-- name: not_before_column
-- Version 9: when a retried pending target may be claimed again (unix seconds); NULL, what every other
-- program inserts, is now. Added by open_db when missing.
ALTER TABLE batch_target ADD COLUMN not_before INTEGER;

-- name: totals
-- Triggers keep the byte total whoever writes the file, and open_db recomputes it, so a file written by a
-- program that never knew of this table is still right.
CREATE TABLE IF NOT EXISTS batch_totals (id INTEGER PRIMARY KEY CHECK (id = 0), nbytes INTEGER NOT NULL);

CREATE TRIGGER IF NOT EXISTS batch_totals_insert AFTER INSERT ON batch_job BEGIN UPDATE batch_totals SET nbytes = nbytes + NEW.nbytes WHERE id = 0; END;

CREATE TRIGGER IF NOT EXISTS batch_totals_delete AFTER DELETE ON batch_job BEGIN UPDATE batch_totals SET nbytes = nbytes - OLD.nbytes WHERE id = 0; END;

CREATE TRIGGER IF NOT EXISTS batch_totals_update AFTER UPDATE OF nbytes ON batch_job WHEN NEW.nbytes IS NOT OLD.nbytes BEGIN UPDATE batch_totals SET nbytes = nbytes + NEW.nbytes - OLD.nbytes WHERE id = 0; END;
