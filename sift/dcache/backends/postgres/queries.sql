-- The PostgreSQL store's own statements beyond the rules' (which Peewee compiles): its locks and its
-- maintenance. Loaded by writes.py and maintenance.py.

-- name: lock_job
SELECT 1 FROM batch_job WHERE id = %s FOR NO KEY UPDATE;

-- name: lock_target
SELECT 1 FROM batch_job j JOIN batch_target t ON t.job_id = j.id WHERE j.id = %s AND t.idx = %s FOR NO KEY UPDATE OF j FOR UPDATE OF t;

-- name: lock_key
-- Advisory locks are the database's, not the schema's: each key names its store's schema.
SELECT pg_advisory_xact_lock(hashtextextended(%s || chr(31) || %s || chr(31) || %s, 0));

-- name: lock_removals
SELECT pg_advisory_xact_lock(hashtextextended(%s, 0));

-- name: schema_present
-- The schema's objects present in the store's schema, as (kind, name).
SELECT CASE c.relkind WHEN 'i' THEN 'index' ELSE 'table' END, c.relname FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'i')
    UNION ALL SELECT 'trigger', t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal
    AND t.tgenabled <> 'D'
    UNION ALL SELECT 'function', p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = %s;

-- name: lock_jobs
-- A repair chunk's jobs ({where}: a range of ids), locked in one order before their targets are read again.
SELECT 1 FROM batch_job WHERE {where} ORDER BY id FOR NO KEY UPDATE;

-- name: lock_totals
-- The total is recomputed with writers held off (readers go on).
LOCK TABLE batch_totals IN EXCLUSIVE MODE;

-- name: recompute_slots
-- The total recomputed into slot 0, the other slots to 0.
UPDATE batch_totals SET nbytes = CASE WHEN slot = 0 THEN (SELECT COALESCE(SUM(nbytes), 0) FROM batch_job) ELSE 0 END;

-- name: relation_space
-- The tables of the store's schema: size with indexes and TOAST, and the statistics' dead rows.
SELECT c.relname, pg_total_relation_size(c.oid), COALESCE(s.n_dead_tup, 0)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid
    WHERE n.nspname = %s AND c.relname = ANY(%s) AND c.relkind = 'r';

-- name: write_targets
-- A call's target writes (no idx twice) as one statement, run on its own (autocommit): the job, then its
-- targets in idx order, locked as lock_target locks them; the count, bytes and lease moved by the locked
-- rows' values, never the statement's snapshot (which may be older than the locks); and written only if
-- every write passes the per-target rule (the target exists, does not go back from done or failed, and is
-- the runner's, with one given). Otherwise nothing is written, and the rows updated are 0.
WITH w AS (
    SELECT * FROM unnest(%(idx)s::bigint[], %(status)s::text[], %(final)s::bigint[], %(size)s::bigint[],
        %(result)s::text[], %(error)s::text[], %(hint)s::text[]) AS w(idx, status, final, size, result, error, hint)
), j AS MATERIALIZED (
    SELECT id FROM batch_job WHERE id = %(job_id)s FOR NO KEY UPDATE
), t AS MATERIALIZED (
    SELECT t.idx, t.status, t.runner, COALESCE(octet_length(t.result), 0) AS size FROM batch_target t
    WHERE t.job_id = (SELECT id FROM j) AND t.idx = ANY(%(idx)s::bigint[]) ORDER BY t.idx FOR UPDATE
), ok AS MATERIALIZED (
    SELECT w.idx, w.status, w.final, w.size, w.result, w.error, w.hint,
        CASE WHEN t.status IN ('done', 'failed') THEN 1 ELSE 0 END AS was_final, t.size AS old_size
    FROM w JOIN t USING (idx)
    WHERE (w.final = 1 OR t.status NOT IN ('done', 'failed'))
        AND (%(runner)s::text IS NULL OR t.runner = %(runner)s::text)
), every AS MATERIALIZED (
    SELECT count(*) = %(n)s AS passed FROM ok
), job AS (
    UPDATE batch_job SET targets_done = targets_done + moved.done, nbytes = nbytes + moved.bytes,
        lease = %(now)s
    FROM (SELECT sum(final - was_final) AS done, sum(size - old_size) AS bytes FROM ok) AS moved
    WHERE id = %(job_id)s AND (SELECT passed FROM every)
    RETURNING 1
)
UPDATE batch_target AS t SET status = ok.status, result = ok.result, error = ok.error, hint = ok.hint,
    runner = CASE WHEN ok.status IN ('pending', 'failed') THEN NULL ELSE t.runner END,
    heartbeat = CASE WHEN ok.status IN ('pending', 'failed') THEN NULL ELSE t.heartbeat END
FROM ok
WHERE t.job_id = %(job_id)s AND t.idx = ok.idx AND EXISTS (SELECT 1 FROM job);
