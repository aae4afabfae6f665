-- The integrity check's statements (sift/dcache/integrity.py), for every backend. When the check first
-- runs on a backend it fills in that backend's spellings: {mark} (its parameter placeholder),
-- {count_final} and {count_invalid} (counts of the final targets and of those with a status outside the
-- enum), {count_invalid_options} (of those whose options are not JSON), {count_unsound_claims} (of those
-- whose claim columns break the claims' rules), {count_pending_results} (of the pending ones holding a
-- result), {result_bytes}, {least_bound},
-- {integer_idx}, and the status lists {final} and {valid_target}.
-- Each run fills in {where} ({jobs}, {targets}): a range of ids, and {column}: the field a fix writes.

-- name: target_groups
-- One pass over the targets of a range of jobs, in primary-key order (no sort): per job, the rows, the
-- final ones, the UTF-8 bytes of the results, the statuses outside the enum, the smallest and largest idx,
-- the options that are not JSON, the claims that are not sound, the pending targets that hold a result.
SELECT job_id, COUNT(*), {count_final},
            COALESCE(SUM({result_bytes}), 0), {count_invalid}, MIN(idx),
            MAX(idx), {count_invalid_options}, {count_unsound_claims}, {count_pending_results}
            FROM batch_target WHERE {where} GROUP BY job_id;

-- name: jobs
SELECT id, status, targets_total, targets_done, nbytes, created_at FROM batch_job WHERE {where} ORDER BY id;

-- name: hosts
-- The URL and stored host (schema version 4) of each target a claim reads the host of (pending, running),
-- for the check's url_host(url) in Python.
SELECT job_id, idx, url, host FROM batch_target WHERE {where} AND status IN ('pending', 'running');

-- name: bad_statuses
-- The statuses outside the enum of one job's targets, for the report (only when there are some).
SELECT MIN(status), MAX(status) FROM batch_target
            WHERE job_id = {mark} AND status NOT IN ({valid_target});

-- name: chunk_end
-- The last job id of the next chunk: the lesser of the JOBS_PER_CHUNK-th job and the TARGETS_PER_CHUNK-th
-- target's job after the bound.
SELECT {least_bound} FROM (SELECT (SELECT id FROM batch_job WHERE {jobs} ORDER BY id LIMIT 1 OFFSET {mark}) AS j, (SELECT job_id FROM batch_target WHERE {targets} ORDER BY job_id LIMIT 1 OFFSET {mark}) AS t) AS bounds;

-- name: idx_outside
SELECT idx FROM batch_target WHERE job_id = {mark} AND NOT ({integer_idx}idx >= 0 AND idx < {mark}) ORDER BY idx LIMIT 6;

-- name: fix_job
UPDATE batch_job SET {column} = {mark} WHERE id = {mark};

-- name: delete_orphans
-- Only while the job is still missing: a job created since the read keeps its targets.
DELETE FROM batch_target WHERE job_id = {mark} AND NOT EXISTS (SELECT 1 FROM batch_job WHERE batch_job.id = batch_target.job_id);
