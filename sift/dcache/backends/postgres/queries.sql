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
