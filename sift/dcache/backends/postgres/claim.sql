-- The claim (claim_batch_targets) as a server function: the order and the rules of sift.dcache.claimorder
-- (ClaimOrder, HostRules), statement for statement, run by the server, so that a claim is one statement
-- however many callers, jobs and hosts it walks. Loaded by schema.py (version 11's DDL, made without
-- str.format: the body holds no placeholder) and by writes.py (the call). No blank line inside the
-- function: a blank line ends a statement here.

-- name: version_11
-- Version 11: the claim in one statement. The order and rules are claimorder.py's, which SQLite runs in
-- Python: the ring's row locked first (claims take turns, so the ring is global and the per-host counts
-- exact), the due delayed targets moved, then the ring of callers (weighted turns from the saved cursor),
-- each caller's oldest job first, a job's targets host by host (byte order) then idx, per_job, per_host,
-- the hosts' policies (cap, pacing, back-off), paused jobs and callers skipped. Its queries are
-- claimorder.py's statements as PostgreSQL runs them, on the same indexes. The times are the caller's
-- (p_now in seconds, p_now_ms in milliseconds): the package reads the clock in one place. Returns the
-- claimed targets, each with its host, whether this claim paced that host, and its place in the claim's
-- order (whole rounds are taken member by member but handed out round by round: the call sorts by place).
-- Its search_path is the store's schema, fixed when it is made, as batch_totals_track's.
CREATE OR REPLACE FUNCTION sift_claim_batch(p_limit BIGINT, p_per_job BIGINT, p_per_host BIGINT, p_fair BOOLEAN, p_classes TEXT[], p_weights BIGINT[], p_runner TEXT, p_now BIGINT, p_now_ms BIGINT, p_slack_ms BIGINT)
    RETURNS TABLE (o_job_id TEXT, o_idx BIGINT, o_url TEXT, o_options JSON, o_status TEXT, o_result TEXT,
        o_error TEXT, o_hint TEXT, o_runner TEXT, o_heartbeat BIGINT, o_attempts BIGINT, o_host TEXT,
        o_paced BOOLEAN, o_place BIGINT)
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
    DECLARE
        v_ring_caller TEXT;
        v_ring_turns BIGINT;
        v_ring_found BOOLEAN;
        v_max_weight BIGINT;
        v_claimed BIGINT := 0;
        v_taken_from TEXT[] := ARRAY[]::TEXT[];
        -- HostRules: active, the default policy, each reached host's cap and interval, the hosts this claim
        -- paced (their next due time), and the running targets by host (read where a cap first applies).
        v_hosts_active BOOLEAN := p_per_host IS NOT NULL;
        v_default_cap BIGINT;
        v_default_interval BIGINT := 0;
        v_rule_host TEXT[] := ARRAY[]::TEXT[];
        v_rule_cap BIGINT[] := ARRAY[]::BIGINT[];
        v_rule_interval BIGINT[] := ARRAY[]::BIGINT[];
        v_paced_host TEXT[] := ARRAY[]::TEXT[];
        v_paced_due BIGINT[] := ARRAY[]::BIGINT[];
        v_running_read BOOLEAN := FALSE;
        v_running_host TEXT[];
        v_running_count BIGINT[];
        -- The ring's members (ClaimOrder.members), one index each, and each one's current job (_Job).
        v_name TEXT[] := ARRAY[]::TEXT[];
        v_weight BIGINT[] := ARRAY[]::BIGINT[];
        v_out BOOLEAN[] := ARRAY[]::BOOLEAN[];
        v_after_created BIGINT[] := ARRAY[]::BIGINT[];
        v_after_seq BIGINT[] := ARRAY[]::BIGINT[];
        v_job TEXT[] := ARRAY[]::TEXT[];
        v_job_created BIGINT[] := ARRAY[]::BIGINT[];
        v_job_seq BIGINT[] := ARRAY[]::BIGINT[];
        v_job_taken BIGINT[] := ARRAY[]::BIGINT[];
        v_job_done BOOLEAN[] := ARRAY[]::BOOLEAN[];
        v_job_host TEXT[] := ARRAY[]::TEXT[];
        v_job_inclusive BOOLEAN[] := ARRAY[]::BOOLEAN[];
        v_lap_closed BOOLEAN := FALSE;
        v_cur INT;
        v_first INT;
        v_used BIGINT := 0;
        v_last TEXT;
        v_last_used BIGINT;
        v_follow BOOLEAN := FALSE;
        v_from TEXT;
        v_found BOOLEAN;
        v_want BIGINT;
        v_got BIGINT;
        v_ask BIGINT;
        v_took BIGINT;
        v_host_ask BIGINT;
        v_host_got BIGINT;
        v_room BIGINT;
        v_k INT;
        v_at INT;
        v_id TEXT;
        v_created BIGINT;
        v_seq BIGINT;
        v_class TEXT;
        v_caller TEXT;
        v_host TEXT;
        v_cap BIGINT;
        v_interval BIGINT;
        -- Whole rounds (ClaimOrder._rounds): the members in ring order, the turns a round (v_stride), how
        -- many rounds, what each member took, and where the block's rows start in the claim's order. Each
        -- row's place (o_place) puts them round by round, member by member, as turn by turn would.
        v_block INT[];
        v_block_got BIGINT[];
        v_block_at INT := 0;
        v_block_start BIGINT;
        v_offset BIGINT[];
        v_stride BIGINT;
        v_rounds BIGINT;
        v_place BIGINT := 0;
        v_base BIGINT;
        v_k0 BIGINT;
        v_width BIGINT;
        v_step BIGINT;
    BEGIN
        -- ClaimOrder.run: the ring's row first, then the due delayed targets, then the host rules' load.
        SELECT r.caller, r.turns INTO v_ring_caller, v_ring_turns FROM batch_claim_ring r WHERE r.id = 0 FOR UPDATE;
        v_ring_found := FOUND;
        UPDATE batch_target t SET not_before = (SELECT b.backed_off_until_ms / 1000 FROM batch_host_policy b
            WHERE t.host = b.host AND b.backed_off_until_ms / 1000 > p_now)
            WHERE t.not_before IS NOT NULL AND t.not_before <= p_now;
        PERFORM p.host FROM batch_host_policy p LIMIT 1;
        IF FOUND THEN
            v_hosts_active := TRUE;
            SELECT p.max_running, p.min_interval_ms INTO v_default_cap, v_default_interval
                FROM batch_host_policy p WHERE p.host = '*';
            v_default_interval := COALESCE(v_default_interval, 0);
        END IF;
        SELECT COALESCE(max(u.w), 1) INTO v_max_weight FROM unnest(p_weights) AS u(w);
        IF NOT p_fair THEN
            -- fair=False: one member whose jobs are every caller's, oldest first (ClaimOrder._oldest_first).
            v_name[1] := NULL; v_weight[1] := p_limit; v_out[1] := FALSE;
            v_after_created[1] := -1; v_after_seq[1] := -1; v_job[1] := NULL;
            v_cur := 1;
        ELSIF v_ring_found THEN
            -- ClaimOrder._ring: the member the cursor names goes on with its turn, if it has turns left.
            v_last := v_ring_caller; v_last_used := v_ring_turns;
            IF v_ring_caller IS NOT NULL AND 0 < v_ring_turns AND v_ring_turns < v_max_weight THEN
                v_k := 1;
                v_name[v_k] := v_ring_caller; v_weight[v_k] := 1; v_out[v_k] := FALSE;
                v_after_created[v_k] := -1; v_after_seq[v_k] := -1; v_job[v_k] := NULL;
                SELECT j.id, j.created_at, j.seq, j.caller_class INTO v_id, v_created, v_seq, v_class
                    FROM batch_job j WHERE j.status IN ('queued', 'running') AND j.caller COLLATE "C" = v_ring_caller
                    AND (j.created_at, j.seq) > (-1, -1)
                    AND COALESCE((SELECT 1 FROM batch_paused_job pj WHERE pj.job_id = j.id), 0) <> 1
                    AND COALESCE((SELECT 1 FROM batch_paused_caller pc WHERE pc.caller = j.caller), 0) <> 1
                    AND (SELECT t.idx FROM batch_target t WHERE t.job_id = j.id AND t.status = 'pending'
                        AND t.not_before IS NULL AND t.host COLLATE "C" >= '' ORDER BY t.host COLLATE "C", t.idx LIMIT 1) IS NOT NULL
                    ORDER BY j.created_at, j.seq LIMIT 1 FOR UPDATE;
                IF FOUND THEN
                    v_job[v_k] := v_id; v_job_created[v_k] := v_created; v_job_seq[v_k] := v_seq;
                    v_job_taken[v_k] := 0; v_job_done[v_k] := FALSE; v_job_host[v_k] := ''; v_job_inclusive[v_k] := TRUE;
                    v_weight[v_k] := COALESCE(p_weights[array_position(p_classes, v_class)], 1);
                    IF v_ring_turns < v_weight[v_k] THEN
                        v_cur := v_k; v_used := v_ring_turns;
                    END IF;
                ELSE
                    v_out[v_k] := TRUE;
                END IF;
            END IF;
            IF v_cur IS NULL THEN
                v_follow := TRUE; v_from := v_ring_caller;
            END IF;
        END IF;
        <<turns>>
        LOOP
            IF v_block_at = 0 THEN  -- a turn (in a block of rounds, the next member's share)
                EXIT turns WHEN v_claimed >= p_limit OR (v_cur IS NULL AND NOT v_follow);  -- no ring row: no claim
                IF v_follow THEN
                    -- ClaimOrder._following(v_from): the next caller by a search until the ring is rounded once,
                    -- then among the members known.
                    v_follow := FALSE; v_used := 0; v_cur := NULL;
                    IF NOT v_lap_closed THEN
                        v_found := FALSE;
                        IF v_from IS NOT NULL THEN
                            SELECT j.id, j.created_at, j.seq, j.caller_class, j.caller INTO v_id, v_created, v_seq, v_class, v_caller
                                FROM batch_job j WHERE j.status IN ('queued', 'running')
                                AND COALESCE((SELECT 1 FROM batch_paused_job pj WHERE pj.job_id = j.id), 0) <> 1
                                AND COALESCE((SELECT 1 FROM batch_paused_caller pc WHERE pc.caller = j.caller), 0) <> 1
                                AND (SELECT t.idx FROM batch_target t WHERE t.job_id = j.id AND t.status = 'pending'
                                    AND t.not_before IS NULL AND t.host COLLATE "C" >= '' ORDER BY t.host COLLATE "C", t.idx LIMIT 1) IS NOT NULL
                                AND j.caller COLLATE "C" > v_from
                                ORDER BY j.caller COLLATE "C", j.created_at, j.seq LIMIT 1 FOR UPDATE;
                            v_found := FOUND;
                        END IF;
                        IF NOT v_found THEN
                            SELECT j.id, j.created_at, j.seq, j.caller_class, j.caller INTO v_id, v_created, v_seq, v_class, v_caller
                                FROM batch_job j WHERE j.status IN ('queued', 'running')
                                AND COALESCE((SELECT 1 FROM batch_paused_job pj WHERE pj.job_id = j.id), 0) <> 1
                                AND COALESCE((SELECT 1 FROM batch_paused_caller pc WHERE pc.caller = j.caller), 0) <> 1
                                AND (SELECT t.idx FROM batch_target t WHERE t.job_id = j.id AND t.status = 'pending'
                                    AND t.not_before IS NULL AND t.host COLLATE "C" >= '' ORDER BY t.host COLLATE "C", t.idx LIMIT 1) IS NOT NULL
                                ORDER BY j.caller COLLATE "C", j.created_at, j.seq LIMIT 1 FOR UPDATE;
                            v_found := FOUND;
                        END IF;
                        EXIT turns WHEN NOT v_found;
                        IF array_position(v_name, v_caller) IS NULL THEN
                            -- ClaimOrder._join: a new member, its weight its oldest job's class.
                            v_k := COALESCE(array_length(v_name, 1), 0) + 1;
                            v_name[v_k] := v_caller; v_out[v_k] := FALSE;
                            v_weight[v_k] := COALESCE(p_weights[array_position(p_classes, v_class)], 1);
                            v_after_created[v_k] := -1; v_after_seq[v_k] := -1;
                            v_job[v_k] := v_id; v_job_created[v_k] := v_created; v_job_seq[v_k] := v_seq;
                            v_job_taken[v_k] := 0; v_job_done[v_k] := FALSE; v_job_host[v_k] := ''; v_job_inclusive[v_k] := TRUE;
                            v_cur := v_k;
                        ELSE
                            v_lap_closed := TRUE;
                        END IF;
                    END IF;
                    IF v_cur IS NULL THEN
                        -- The ring rounded: the next member in byte order after v_from, wrapping round.
                        v_first := NULL;
                        FOR i IN 1 .. COALESCE(array_length(v_name, 1), 0) LOOP
                            CONTINUE WHEN v_out[i];
                            IF v_first IS NULL OR v_name[i] COLLATE "C" < v_name[v_first] COLLATE "C" THEN
                                v_first := i;
                            END IF;
                            IF (v_from IS NULL OR v_name[i] COLLATE "C" > v_from COLLATE "C")
                                    AND (v_cur IS NULL OR v_name[i] COLLATE "C" < v_name[v_cur] COLLATE "C") THEN
                                v_cur := i;
                            END IF;
                        END LOOP;
                        v_cur := COALESCE(v_cur, v_first);
                        EXIT turns WHEN v_cur IS NULL;
                    END IF;
                END IF;
                v_want := LEAST(v_weight[v_cur] - v_used, p_limit - v_claimed);
                IF p_fair AND v_block_at = 0 AND v_used = 0 AND v_lap_closed AND NOT v_hosts_active THEN
                    -- Every member known and no host rule: k whole rounds from v_cur at once (the same targets).
                    v_block := ARRAY[]::INT[];
                    FOR i IN 1 .. COALESCE(array_length(v_name, 1), 0) LOOP
                        IF NOT v_out[i] THEN
                            v_block := v_block || i;
                        END IF;
                    END LOOP;
                    SELECT array_agg(b.i ORDER BY v_name[b.i] COLLATE "C" < v_name[v_cur] COLLATE "C", v_name[b.i] COLLATE "C")
                        INTO v_block FROM unnest(v_block) AS b(i);
                    v_stride := 0;
                    v_offset := ARRAY[]::BIGINT[];
                    FOR i IN 1 .. cardinality(v_block) LOOP
                        v_offset[i] := v_stride;
                        v_stride := v_stride + v_weight[v_block[i]];
                    END LOOP;
                    v_rounds := (p_limit - v_claimed) / v_stride;
                    IF v_rounds > 0 THEN
                        v_block_at := 1; v_block_start := v_place; v_block_got := ARRAY[]::BIGINT[];
                        v_want := v_rounds * v_weight[v_cur];
                    END IF;
                END IF;
            END IF;
            -- ClaimOrder._serve: up to v_want of the member's jobs' targets, oldest job first, per_job each.
            v_got := 0;
            WHILE v_got < v_want AND NOT v_out[v_cur] LOOP
                IF v_job[v_cur] IS NULL THEN
                    IF p_fair THEN
                        SELECT j.id, j.created_at, j.seq, j.caller_class INTO v_id, v_created, v_seq, v_class
                            FROM batch_job j WHERE j.status IN ('queued', 'running') AND j.caller COLLATE "C" = v_name[v_cur]
                            AND (j.created_at, j.seq) > (v_after_created[v_cur], v_after_seq[v_cur])
                            AND COALESCE((SELECT 1 FROM batch_paused_job pj WHERE pj.job_id = j.id), 0) <> 1
                            AND COALESCE((SELECT 1 FROM batch_paused_caller pc WHERE pc.caller = j.caller), 0) <> 1
                            AND (SELECT t.idx FROM batch_target t WHERE t.job_id = j.id AND t.status = 'pending'
                                AND t.not_before IS NULL AND t.host COLLATE "C" >= '' ORDER BY t.host COLLATE "C", t.idx LIMIT 1) IS NOT NULL
                            ORDER BY j.created_at, j.seq LIMIT 1 FOR UPDATE;
                    ELSE
                        SELECT j.id, j.created_at, j.seq, j.caller_class INTO v_id, v_created, v_seq, v_class
                            FROM batch_job j WHERE j.status IN ('queued', 'running')
                            AND (j.created_at, j.seq) > (v_after_created[v_cur], v_after_seq[v_cur])
                            AND COALESCE((SELECT 1 FROM batch_paused_job pj WHERE pj.job_id = j.id), 0) <> 1
                            AND COALESCE((SELECT 1 FROM batch_paused_caller pc WHERE pc.caller = j.caller), 0) <> 1
                            AND (SELECT t.idx FROM batch_target t WHERE t.job_id = j.id AND t.status = 'pending'
                                AND t.not_before IS NULL AND t.host COLLATE "C" >= '' ORDER BY t.host COLLATE "C", t.idx LIMIT 1) IS NOT NULL
                            ORDER BY j.created_at, j.seq LIMIT 1 FOR UPDATE;
                    END IF;
                    IF NOT FOUND THEN
                        v_out[v_cur] := TRUE;
                        EXIT;
                    END IF;
                    v_job[v_cur] := v_id; v_job_created[v_cur] := v_created; v_job_seq[v_cur] := v_seq;
                    v_job_taken[v_cur] := 0; v_job_done[v_cur] := FALSE; v_job_host[v_cur] := ''; v_job_inclusive[v_cur] := TRUE;
                END IF;
                -- ClaimOrder._take: up to v_ask of the job's pending targets, host by host, then idx.
                v_ask := LEAST(p_per_job - v_job_taken[v_cur], v_want - v_got);
                v_took := 0;
                IF NOT v_hosts_active THEN
                    IF v_block_at > 0 THEN
                        v_base := v_block_start + v_offset[v_block_at]; v_k0 := v_got + v_took;
                        v_width := v_weight[v_cur]; v_step := v_stride;
                    ELSE
                        v_base := v_place; v_k0 := 0; v_width := 4611686018427387904; v_step := 0;
                    END IF;
                    RETURN QUERY WITH picked AS MATERIALIZED (
                        SELECT p.ctid AS address FROM batch_target p WHERE p.job_id = v_job[v_cur] AND p.status = 'pending'
                            AND p.not_before IS NULL AND p.host COLLATE "C" >= ''
                            ORDER BY p.host COLLATE "C", p.idx LIMIT v_ask FOR UPDATE SKIP LOCKED
                    ), taken AS (
                        UPDATE batch_target t SET status = 'running', runner = p_runner, heartbeat = p_now, attempts = t.attempts + 1
                            WHERE t.ctid = ANY(ARRAY(SELECT picked.address FROM picked))
                            RETURNING t.job_id, t.idx, t.url, t.options, t.status, t.result, t.error, t.hint, t.runner,
                                t.heartbeat, t.attempts, t.host
                    ) SELECT taken.*, FALSE, v_base + ((v_k0 + row_number() OVER (ORDER BY taken.host COLLATE "C", taken.idx) - 1) / v_width) * v_step
                        + (v_k0 + row_number() OVER (ORDER BY taken.host COLLATE "C", taken.idx) - 1) % v_width FROM taken;
                    GET DIAGNOSTICS v_took = ROW_COUNT;
                    IF v_block_at = 0 THEN
                        v_place := v_place + v_took;
                    END IF;
                    IF v_took < v_ask THEN
                        v_job_done[v_cur] := TRUE;
                    END IF;
                ELSE
                    -- ClaimOrder._take_by_host: the job's hosts walked in order past the held ones, each
                    -- taking what its rules leave room for. Two walks, as claimorder.py's two statements:
                    -- from the job's host itself, or past it. One walk with "host <> it" would read every
                    -- pending entry of the host just taken before reaching the next one.
                    WHILE v_took < v_ask LOOP
                        IF v_job_inclusive[v_cur] THEN
                            WITH RECURSIVE walk (host) AS ((SELECT (SELECT t.host FROM batch_target t
                                    WHERE t.job_id = v_job[v_cur] AND t.status = 'pending' AND t.not_before IS NULL
                                    AND t.host COLLATE "C" >= v_job_host[v_cur] ORDER BY t.host COLLATE "C" LIMIT 1) AS host)
                                UNION ALL (SELECT (SELECT later.host FROM batch_target later
                                    WHERE later.job_id = v_job[v_cur] AND later.status = 'pending' AND later.not_before IS NULL
                                    AND later.host COLLATE "C" > walk.host COLLATE "C" ORDER BY later.host COLLATE "C" LIMIT 1) AS host
                                    FROM walk WHERE walk.host IS NOT NULL
                                    AND COALESCE((SELECT 1 FROM batch_host_policy held WHERE held.host = walk.host AND held.host <> '*'
                                        AND (held.next_due_ms > p_now_ms OR held.backed_off_until_ms > p_now_ms)), 0) = 1))
                            SELECT walk.host, (SELECT s.max_running FROM batch_host_policy s WHERE s.host = walk.host),
                                (SELECT s.min_interval_ms FROM batch_host_policy s WHERE s.host = walk.host)
                                INTO v_host, v_cap, v_interval
                                FROM walk WHERE walk.host IS NOT NULL
                                AND COALESCE((SELECT 1 FROM batch_host_policy held WHERE held.host = walk.host AND held.host <> '*'
                                    AND (held.next_due_ms > p_now_ms OR held.backed_off_until_ms > p_now_ms)), 0) <> 1
                                LIMIT 1;
                        ELSE
                            WITH RECURSIVE walk (host) AS ((SELECT (SELECT t.host FROM batch_target t
                                    WHERE t.job_id = v_job[v_cur] AND t.status = 'pending' AND t.not_before IS NULL
                                    AND t.host COLLATE "C" > v_job_host[v_cur] ORDER BY t.host COLLATE "C" LIMIT 1) AS host)
                                UNION ALL (SELECT (SELECT later.host FROM batch_target later
                                    WHERE later.job_id = v_job[v_cur] AND later.status = 'pending' AND later.not_before IS NULL
                                    AND later.host COLLATE "C" > walk.host COLLATE "C" ORDER BY later.host COLLATE "C" LIMIT 1) AS host
                                    FROM walk WHERE walk.host IS NOT NULL
                                    AND COALESCE((SELECT 1 FROM batch_host_policy held WHERE held.host = walk.host AND held.host <> '*'
                                        AND (held.next_due_ms > p_now_ms OR held.backed_off_until_ms > p_now_ms)), 0) = 1))
                            SELECT walk.host, (SELECT s.max_running FROM batch_host_policy s WHERE s.host = walk.host),
                                (SELECT s.min_interval_ms FROM batch_host_policy s WHERE s.host = walk.host)
                                INTO v_host, v_cap, v_interval
                                FROM walk WHERE walk.host IS NOT NULL
                                AND COALESCE((SELECT 1 FROM batch_host_policy held WHERE held.host = walk.host AND held.host <> '*'
                                    AND (held.next_due_ms > p_now_ms OR held.backed_off_until_ms > p_now_ms)), 0) <> 1
                                LIMIT 1;
                        END IF;
                        IF NOT FOUND THEN
                            v_job_done[v_cur] := TRUE;
                            EXIT;
                        END IF;
                        -- HostRules.reached: the host's rule, once a claim (the default's where its row is silent).
                        v_k := array_position(v_rule_host, v_host);
                        IF v_k IS NULL THEN
                            IF v_host = '*' THEN
                                v_cap := NULL; v_interval := NULL;
                            END IF;
                            v_k := COALESCE(array_length(v_rule_host, 1), 0) + 1;
                            v_rule_host[v_k] := v_host;
                            v_rule_cap[v_k] := LEAST(p_per_host, COALESCE(v_cap, v_default_cap));  -- LEAST skips NULLs
                            v_rule_interval[v_k] := COALESCE(v_interval, v_default_interval);
                        END IF;
                        v_job_host[v_cur] := v_host; v_job_inclusive[v_cur] := TRUE;
                        -- HostRules.room, read before and after the take (the same lines: SQL has no closures).
                        FOR v_pass IN 1 .. 2 LOOP
                            IF v_host = ANY(v_paced_host) THEN
                                v_room := 0;
                            ELSE
                                v_room := 4611686018427387904;  -- no cap: more than any claim takes
                                IF v_rule_cap[v_k] IS NOT NULL THEN
                                    IF NOT v_running_read THEN  -- read once, bounded by what runners hold
                                        SELECT COALESCE(array_agg(r.host), ARRAY[]::TEXT[]), COALESCE(array_agg(r.n), ARRAY[]::BIGINT[])
                                            INTO v_running_host, v_running_count
                                            FROM (SELECT t.host, count(*) AS n FROM batch_target t WHERE t.status = 'running' GROUP BY t.host) r;
                                        v_running_read := TRUE;
                                    END IF;
                                    v_room := v_rule_cap[v_k] - COALESCE(v_running_count[array_position(v_running_host, v_host)], 0);
                                END IF;
                                IF v_rule_interval[v_k] <> 0 THEN
                                    v_room := LEAST(v_room, 1);
                                END IF;
                            END IF;
                            EXIT WHEN v_pass = 2 OR v_room <= 0;
                            v_host_ask := LEAST(v_room, v_ask - v_took);
                            RETURN QUERY WITH picked AS MATERIALIZED (
                                SELECT p.ctid AS address FROM batch_target p WHERE p.job_id = v_job[v_cur] AND p.status = 'pending'
                                    AND p.not_before IS NULL AND p.host COLLATE "C" >= v_host AND p.host COLLATE "C" <= v_host
                                    ORDER BY p.host COLLATE "C", p.idx LIMIT v_host_ask FOR UPDATE SKIP LOCKED
                            ), taken AS (
                                UPDATE batch_target t SET status = 'running', runner = p_runner, heartbeat = p_now, attempts = t.attempts + 1
                                    WHERE t.ctid = ANY(ARRAY(SELECT picked.address FROM picked))
                                    RETURNING t.job_id, t.idx, t.url, t.options, t.status, t.result, t.error, t.hint, t.runner,
                                        t.heartbeat, t.attempts, t.host
                            ) SELECT taken.*, v_rule_interval[v_k] <> 0, v_place - 1
                                + row_number() OVER (ORDER BY taken.host COLLATE "C", taken.idx) FROM taken;
                            GET DIAGNOSTICS v_host_got = ROW_COUNT;
                            v_place := v_place + v_host_got;
                            -- HostRules.took: counted as running; a paced host is next due after its interval.
                            IF v_running_read THEN
                                v_at := array_position(v_running_host, v_host);
                                IF v_at IS NULL THEN
                                    v_running_host := v_running_host || v_host;
                                    v_running_count := v_running_count || v_host_got;
                                ELSE
                                    v_running_count[v_at] := v_running_count[v_at] + v_host_got;
                                END IF;
                            END IF;
                            IF v_host_got > 0 AND v_rule_interval[v_k] <> 0 THEN
                                v_paced_host := v_paced_host || v_host;
                                v_paced_due := v_paced_due || (p_now_ms + v_rule_interval[v_k] + p_slack_ms);
                            END IF;
                            v_took := v_took + v_host_got;
                            IF v_host_got <> v_host_ask THEN
                                v_room := 0;  -- the host has no more in this job
                                EXIT;
                            END IF;
                        END LOOP;
                        CONTINUE WHEN v_room > 0;  -- the want is met, or the host has more
                        v_job_inclusive[v_cur] := FALSE;  -- held back, or no more of it in this job: the next host
                    END LOOP;
                END IF;
                IF v_took > 0 THEN
                    IF NOT (v_job[v_cur] = ANY(v_taken_from)) THEN
                        v_taken_from := v_taken_from || v_job[v_cur];
                    END IF;
                    v_job_taken[v_cur] := v_job_taken[v_cur] + v_took;
                    v_claimed := v_claimed + v_took;
                END IF;
                v_got := v_got + v_took;
                IF v_job_done[v_cur] OR v_job_taken[v_cur] >= p_per_job THEN
                    v_after_created[v_cur] := v_job_created[v_cur]; v_after_seq[v_cur] := v_job_seq[v_cur];
                    v_job[v_cur] := NULL;
                END IF;
            END LOOP;
            EXIT turns WHEN NOT p_fair;
            IF v_block_at > 0 THEN
                IF v_got < v_want THEN
                    v_out[v_cur] := TRUE;
                END IF;
                v_block_got[v_block_at] := v_got;
                IF v_block_at < cardinality(v_block) THEN
                    v_block_at := v_block_at + 1;
                    v_cur := v_block[v_block_at];
                    v_want := v_rounds * v_weight[v_cur];
                    CONTINUE turns;
                END IF;
                -- The cursor after the block: the last member served in the last round that served anyone.
                v_block_at := 0;
                v_place := v_block_start + v_rounds * v_stride;
                v_from := NULL;
                <<cursor>>
                FOR r IN REVERSE v_rounds .. 1 LOOP
                    FOR i IN REVERSE cardinality(v_block) .. 1 LOOP
                        IF v_block_got[i] > (r - 1) * v_weight[v_block[i]] THEN
                            v_from := v_name[v_block[i]];
                            v_last := v_from;
                            v_last_used := LEAST(v_weight[v_block[i]], v_block_got[i] - (r - 1) * v_weight[v_block[i]]);
                            EXIT cursor;
                        END IF;
                    END LOOP;
                END LOOP;
                EXIT turns WHEN v_from IS NULL;  -- nobody had anything: every member has left the ring
                v_follow := TRUE; v_used := 0;
                CONTINUE turns;
            END IF;
            -- The turn's end: the cursor follows the last member served; a member short of its want is out.
            IF v_got > 0 THEN
                v_used := v_used + v_got;
                v_last := v_name[v_cur]; v_last_used := v_used;
            END IF;
            IF v_got < v_want THEN
                v_out[v_cur] := TRUE;
            END IF;
            IF v_out[v_cur] OR v_used >= v_weight[v_cur] THEN
                v_follow := TRUE; v_from := v_name[v_cur];
            END IF;
        END LOOP;
        IF p_fair AND v_ring_found AND v_claimed > 0 THEN
            UPDATE batch_claim_ring SET caller = v_last, turns = v_last_used WHERE id = 0;
        END IF;
        IF cardinality(v_taken_from) > 0 THEN
            UPDATE batch_job j SET status = 'running', lease = p_now
                WHERE j.id = ANY(v_taken_from) AND j.status IN ('queued', 'running');
        END IF;
        IF cardinality(v_paced_host) > 0 THEN
            INSERT INTO batch_host_policy AS hp (host, next_due_ms) SELECT * FROM unnest(v_paced_host, v_paced_due)
                ON CONFLICT (host) DO UPDATE SET next_due_ms = EXCLUDED.next_due_ms;
        END IF;
    END $$;

-- name: claim
-- One claim: the function's rows, in the claim's order.
SELECT o_job_id, o_idx, o_url, o_options, o_status, o_result, o_error, o_hint, o_runner, o_heartbeat, o_attempts,
    o_host, o_paced FROM sift_claim_batch(%s::bigint, %s::bigint, %s::bigint, %s::boolean, %s::text[], %s::bigint[], %s::text, %s::bigint,
    %s::bigint, %s::bigint) ORDER BY o_place;
