-- The PostgreSQL store's schema, created in one transaction under an advisory lock. Loaded by schema.py,
-- which fills in {total_slots}, {last_slot} and {schema_version}; the schema check reads the names it
-- creates from here too.

-- name: tables
CREATE TABLE IF NOT EXISTS batch_job (
    id TEXT PRIMARY KEY, caller TEXT NOT NULL, caller_class TEXT NOT NULL, idem_key TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', targets_total BIGINT NOT NULL,
    targets_done BIGINT NOT NULL DEFAULT 0, created_at BIGINT NOT NULL, lease BIGINT NOT NULL,
    nbytes BIGINT NOT NULL DEFAULT 0, seq BIGSERIAL NOT NULL);

-- options is json, not jsonb: json keeps the caller's text verbatim (jsonb rewrites it).
CREATE TABLE IF NOT EXISTS batch_target (
    job_id TEXT NOT NULL, idx BIGINT NOT NULL, url TEXT NOT NULL, options JSON NOT NULL,
    status TEXT NOT NULL, result TEXT, error TEXT, hint TEXT, runner TEXT, heartbeat BIGINT,
    attempts BIGINT NOT NULL DEFAULT 0, host TEXT NOT NULL DEFAULT '', PRIMARY KEY (job_id, idx));

CREATE INDEX IF NOT EXISTS batch_job_idem ON batch_job(caller, idem_key);

CREATE INDEX IF NOT EXISTS batch_job_lease ON batch_job(lease);

CREATE INDEX IF NOT EXISTS batch_job_live ON batch_job(caller) WHERE status IN ('queued', 'running');

CREATE INDEX IF NOT EXISTS batch_job_evictable ON batch_job(lease, created_at, id) WHERE nbytes > 0 AND status IN ('done', 'partial', 'failed', 'cancelled');

-- name: version_2
-- Version 2: what claim_batch_targets reads (live jobs in claim order; version 2 also made an index of each
-- job's pending targets by idx, which version 5 drops), and what rescue_stale_jobs reads (live jobs by
-- lease; batch_job_lease holds the history too).
CREATE INDEX IF NOT EXISTS batch_job_claim ON batch_job(created_at, seq) WHERE status IN ('queued', 'running');

CREATE INDEX IF NOT EXISTS batch_job_live_lease ON batch_job(lease) WHERE status IN ('queued', 'running');

-- name: version_3
-- Version 3: a claim's runner, its heartbeat (unix seconds) and how many times the target was claimed, as
-- columns with SQL-side defaults (a program that names its columns still inserts and reads targets), and
-- the running targets by runner, which renew_claims, release_claims and requeue_stale_claims read.
ALTER TABLE batch_target ADD COLUMN IF NOT EXISTS runner TEXT;

ALTER TABLE batch_target ADD COLUMN IF NOT EXISTS heartbeat BIGINT;

ALTER TABLE batch_target ADD COLUMN IF NOT EXISTS attempts BIGINT NOT NULL DEFAULT 0;

CREATE INDEX IF NOT EXISTS batch_target_running ON batch_target(runner) WHERE status = 'running';

-- name: version_4
-- Version 4: the target's host (url_host(url)), which per-host claim limits count (a program that does not
-- know it inserts '': one host for all its targets; the upgrade fills it in for the stored targets), and
-- what the claim's ring reads: the callers with a live job in byte order, each caller's live jobs in claim
-- order, a job's pending targets host by host (a skip scan), and the ring's cursor, one row.
ALTER TABLE batch_target ADD COLUMN IF NOT EXISTS host TEXT NOT NULL DEFAULT '';

CREATE INDEX IF NOT EXISTS batch_job_ring ON batch_job(caller COLLATE "C", created_at, seq) WHERE status IN ('queued', 'running');

CREATE INDEX IF NOT EXISTS batch_target_host ON batch_target(job_id, host COLLATE "C", idx) WHERE status = 'pending';

CREATE TABLE IF NOT EXISTS batch_claim_ring (id SMALLINT PRIMARY KEY CHECK (id = 0), caller TEXT, turns BIGINT NOT NULL);

INSERT INTO batch_claim_ring (id, caller, turns) VALUES (0, NULL, 0) ON CONFLICT (id) DO NOTHING;

-- name: version_5
-- Version 5: claims read a job's pending targets from batch_target_host alone (host by host, then idx), so
-- the index of them by idx that version 2 made is dropped: every submit, claim and result write moved it.
DROP INDEX IF EXISTS batch_target_pending;

-- name: version_7
-- Version 7: a job's change of status or targets_done is announced on channel sift_batch_job, in the
-- transaction that makes it (delivered at its commit, once per job and transaction), for
-- wait_for_batch_job's one listening connection per process; the payload names the store's schema too, as
-- stores in other schemas of the database share the channel.
CREATE OR REPLACE FUNCTION batch_job_announce() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('sift_batch_job', json_build_array(TG_TABLE_SCHEMA, NEW.id)::text);
        RETURN NULL;
    END $$;

CREATE OR REPLACE TRIGGER batch_job_announce AFTER UPDATE OF status, targets_done ON batch_job FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.targets_done IS DISTINCT FROM NEW.targets_done) EXECUTE FUNCTION batch_job_announce();

-- name: version_8
-- Version 8: politeness. A host's policy (NULL: the default's, the row of host '*'; milliseconds for the
-- interval and times), when the host is next due (pacing) and backed off until, one row a host the
-- operator named or a claim paced; and the paused jobs and callers, whose targets no claim takes. Tables
-- of their own: the original service's tables and statements stay as they were.
CREATE TABLE IF NOT EXISTS batch_host_policy (host TEXT PRIMARY KEY, max_running BIGINT, min_interval_ms BIGINT, next_due_ms BIGINT NOT NULL DEFAULT 0, backed_off_until_ms BIGINT NOT NULL DEFAULT 0);

CREATE TABLE IF NOT EXISTS batch_paused_job (job_id TEXT PRIMARY KEY, paused_at BIGINT NOT NULL);

CREATE TABLE IF NOT EXISTS batch_paused_caller (caller TEXT PRIMARY KEY, paused_at BIGINT NOT NULL);

-- name: version_9
-- Version 9: when a retried pending target may be claimed again (unix seconds; NULL, what every other
-- program inserts, is now). A waiting target stays out of batch_target_host until then, so waiting targets
-- cost a claim nothing; each claim first moves the targets that have come due back (not_before = NULL),
-- read through batch_target_delayed.
ALTER TABLE batch_target ADD COLUMN IF NOT EXISTS not_before BIGINT;

DROP INDEX IF EXISTS batch_target_host;

CREATE INDEX IF NOT EXISTS batch_target_host ON batch_target(job_id, host COLLATE "C", idx) WHERE status = 'pending' AND not_before IS NULL;

CREATE INDEX IF NOT EXISTS batch_target_delayed ON batch_target(not_before) WHERE not_before IS NOT NULL;

-- name: version_10
-- Version 10: the pending targets by host and not_before, which only back_off_host and release_host read: a
-- host backed off moves its claimable targets out of batch_target_host (not_before = the back-off's last
-- second) and back, reading only those it moves.
CREATE INDEX IF NOT EXISTS batch_target_pending_host ON batch_target(host, not_before) WHERE status = 'pending';

-- name: totals
-- Its own autovacuum settings: the slot rows are updated by every write and bloat otherwise.
CREATE TABLE IF NOT EXISTS batch_totals (slot SMALLINT PRIMARY KEY, nbytes BIGINT NOT NULL) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

INSERT INTO batch_totals (slot, nbytes) SELECT g, 0 FROM generate_series(0, {last_slot}) g ON CONFLICT (slot) DO NOTHING;

CREATE OR REPLACE FUNCTION batch_totals_track() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    DECLARE delta BIGINT;
    BEGIN
        IF TG_OP = 'INSERT' THEN delta := NEW.nbytes;
        ELSIF TG_OP = 'DELETE' THEN delta := -OLD.nbytes;
        ELSE delta := NEW.nbytes - OLD.nbytes;
        END IF;
        IF delta <> 0 THEN
            UPDATE batch_totals SET nbytes = nbytes + delta WHERE slot = mod(pg_backend_pid(), {total_slots});
        END IF;
        RETURN NULL;
    END $$;

CREATE OR REPLACE TRIGGER batch_totals_track AFTER INSERT OR DELETE OR UPDATE OF nbytes ON batch_job FOR EACH ROW EXECUTE FUNCTION batch_totals_track();

-- SQLite's json_valid: whether text parses as JSON (PostgreSQL 15 has no pg_input_is_valid).
CREATE OR REPLACE FUNCTION sift_json_valid(value TEXT) RETURNS BOOLEAN LANGUAGE plpgsql IMMUTABLE AS $$
    BEGIN
        PERFORM value::json;
        RETURN TRUE;
    EXCEPTION WHEN invalid_text_representation THEN
        RETURN FALSE;
    END $$;

-- The text as json, in a VOLATILE function: a plain cast of a parameter is folded when the statement is
-- planned, and would fail on invalid JSON even where sift_json_valid said no.
CREATE OR REPLACE FUNCTION sift_json(value TEXT) RETURNS JSON LANGUAGE plpgsql VOLATILE AS $$
    BEGIN
        RETURN value::json;
    END $$;

CREATE TABLE IF NOT EXISTS sift_schema (id SMALLINT PRIMARY KEY CHECK (id = 0), version BIGINT NOT NULL);

INSERT INTO sift_schema (id, version) VALUES (0, {schema_version}) ON CONFLICT (id) DO NOTHING;
