-- Views and macros over the tables declared in schemas/tables.py and schemas/analysis_tables.py.
-- Views are derived, so they are identical whatever order a replay delivers partitions in.

CREATE OR REPLACE VIEW ranks AS
SELECT run_id, rank, world_size, host, pid, local_rank, node_rank, local_world_size,
       torch_version, backend, backend_version, started_at_ns, clock_sync_ns, clock_error_ns,
       session_id, sent_ns AS last_metadata_ns
FROM rank_metadata
QUALIFY row_number() OVER (PARTITION BY run_id, rank ORDER BY sent_ns DESC, session_id DESC) = 1;

CREATE OR REPLACE VIEW runs AS
WITH started AS (
    SELECT run_id, min(started_at_ns) AS started_at_ns, max(world_size) AS world_size,
           arg_max(metadata, sent_ns) AS metadata
    FROM rank_metadata GROUP BY run_id
), finished AS (
    SELECT run_id, count(DISTINCT rank) AS final_ranks, max(sent_ns) AS last_final_ns
    FROM heartbeats WHERE final GROUP BY run_id
), heard AS (
    -- ranks send a heartbeat every second while they live: a run killed before its ranks said
    -- goodbye never gets an end, and this says since when it is silent
    SELECT run_id, max(sent_ns) AS last_heard_ns
    FROM (SELECT run_id, sent_ns FROM heartbeats UNION ALL SELECT run_id, sent_ns FROM rank_metadata)
    GROUP BY run_id
)
SELECT s.run_id,
       make_timestamp(s.started_at_ns // 1000) AS started_at,
       CASE WHEN f.final_ranks >= s.world_size THEN make_timestamp(f.last_final_ns // 1000) END AS ended_at,
       s.world_size,
       s.metadata,
       NULL::TIMESTAMP AS removed_at,
       h.last_heard_ns
FROM started s LEFT JOIN finished f USING (run_id) LEFT JOIN heard h USING (run_id)
UNION ALL
-- a removed run stays listed (its tombstone), with when it was removed
SELECT run_id, make_timestamp(started_ns // 1000), NULL, world_size, NULL, make_timestamp(removed_ns // 1000), NULL
FROM removed_runs WHERE run_id NOT IN (SELECT run_id FROM started);

CREATE OR REPLACE VIEW fr_entries_latest AS
SELECT * FROM fr_entries
QUALIFY row_number() OVER (PARTITION BY run_id, rank, record_id ORDER BY snapshot_ns DESC) = 1;

-- Derived by the analysis flows (flows/clocks.py, flows/steps.py, flows/comms.py, flows/breakdown.py).
-- Each analysis replaces one run's rows in one transaction, so these tables can hold many runs and
-- a run can be re-analyzed while its data keeps arriving.

CREATE OR REPLACE VIEW aligned_events AS
SELECT e.run_id, e.rank, e.name, e.cat, e.ph,
       e.ts_ns - coalesce(o.offset_ns, 0) AS ts_ns, e.dur_ns,
       e.rank::BIGINT AS pid, e.pid AS os_pid, e.tid, e.step,
       (e.rank::BIGINT << 40) | e.flow_id AS flow_id,
       (e.rank::BIGINT << 40) | e.correlation_id AS correlation_id,
       e.args
FROM trace_events e
LEFT JOIN clock_offsets o ON o.run_id = e.run_id AND o.rank = e.rank AND o.chosen;

CREATE OR REPLACE MACRO event_phase(name) AS CASE
    WHEN regexp_matches(lower(name), 'all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all|nccl|gloo|c10d::|\bsend\b|\brecv\b|isend|irecv|communicat')
        THEN 'communication'
    WHEN regexp_matches(lower(name), 'optimizer|optim\.|zero_grad') THEN 'optimizer'
    WHEN regexp_matches(lower(name), 'backward|autograd::engine') THEN 'backward'
    WHEN regexp_matches(lower(name), 'dataloader|data_loader|^data$|^data[ _:.]|load_batch|next_batch|get_batch') THEN 'data'
    WHEN regexp_matches(lower(name), 'forward|^fwd\b') THEN 'forward'
END;

CREATE OR REPLACE MACRO dtype_bytes(dtype) AS CASE
    WHEN lower(dtype) IN ('double', 'float64', 'long', 'int64', 'complexfloat', 'uint64') THEN 8
    WHEN lower(dtype) IN ('float', 'float32', 'int', 'int32', 'uint32') THEN 4
    WHEN lower(dtype) IN ('half', 'float16', 'bfloat16', 'short', 'int16', 'uint16') THEN 2
    WHEN lower(dtype) IN ('complexdouble') THEN 16
    ELSE 1
END;

CREATE OR REPLACE MACRO tensor_bytes(sizes, dtypes) AS coalesce(list_sum(list_transform(
    range(len(sizes)),
    lambda i: coalesce(list_aggregate(sizes[i + 1], 'product'), 1)::BIGINT * dtype_bytes(dtypes[i + 1]))), 0);

CREATE OR REPLACE MACRO rank_offsets(run) AS TABLE
SELECT rank, offset_ns FROM clock_offsets WHERE run_id = run AND chosen;

CREATE OR REPLACE MACRO run_span_pairs(run) AS TABLE
WITH spans AS (
    SELECT rank, tid, name, cat, ph, ts_ns, step, args,
           sum(CASE WHEN ph = 'B' THEN 1 ELSE -1 END) OVER (
               PARTITION BY rank, tid ORDER BY ts_ns, ph DESC ROWS UNBOUNDED PRECEDING) AS depth
    FROM trace_events WHERE run_id = run AND ph IN ('B', 'E')
), numbered AS (
    SELECT *, row_number() OVER (PARTITION BY rank, tid, level, ph ORDER BY ts_ns) AS nth
    FROM (SELECT *, CASE WHEN ph = 'B' THEN depth ELSE depth + 1 END AS level FROM spans)
), last_seen AS (
    SELECT rank, max(ts_ns + coalesce(dur_ns, 0)) AS last_ns FROM trace_events WHERE run_id = run GROUP BY rank
)
SELECT b.rank, b.tid, b.name, b.cat, b.ts_ns AS start_ns, coalesce(e.ts_ns, l.last_ns) AS end_ns, b.step,
       e.ts_ns IS NULL AS unfinished, b.args
FROM numbered b
JOIN last_seen l ON l.rank = b.rank
LEFT JOIN numbered e ON e.ph = 'E' AND e.rank = b.rank AND e.tid = b.tid AND e.level = b.level AND e.nth = b.nth
WHERE b.ph = 'B';

CREATE OR REPLACE MACRO run_own_intervals(run) AS TABLE
SELECT rank, tid, name, cat, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns, step, false AS unfinished, args
FROM trace_events WHERE run_id = run AND ph = 'X' AND dur_ns >= 0
UNION ALL
SELECT * FROM run_span_pairs(run);

CREATE OR REPLACE MACRO run_intervals(run) AS TABLE
SELECT r.rank, r.tid, r.name, r.cat, r.start_ns - coalesce(o.offset_ns, 0) AS start_ns,
       r.end_ns - coalesce(o.offset_ns, 0) AS end_ns, r.step, r.unfinished, r.args
FROM run_own_intervals(run) r LEFT JOIN rank_offsets(run) o USING (rank);

CREATE OR REPLACE MACRO run_steps(run) AS TABLE
WITH markers AS (
    SELECT rank, step, min(ts_ns) AS start_ns,
           coalesce(bool_or(args->>'$.marked_by' = 'optimizer'), false) AS after_optimizer
    FROM trace_events
    WHERE run_id = run AND ph = 'i' AND cat = 'step' AND name = 'step' AND step IS NOT NULL GROUP BY ALL
), step_ends AS (  -- a step's last work: rankstream's own records (marks, exit, clock failures) are not work
    SELECT rank, step, max(ts_ns + coalesce(dur_ns, 0)) AS last_ns FROM trace_events
    WHERE run_id = run AND step IS NOT NULL AND cat NOT IN ('step', 'rankstream') GROUP BY ALL
), rank_ends AS (
    SELECT rank, max(ts_ns + coalesce(dur_ns, 0)) AS last_ns FROM trace_events WHERE run_id = run GROUP BY rank
), marked AS (  -- a step ends where the next starts; the last one at its last work, unless a mark set
                -- after an optimizer step opened it: teardown or a hang follows, an open step (not
                -- finished) that runs to the rank's last event, for timelines, and has no step time
    SELECT m.rank, m.step, m.start_ns,
           coalesce(lead(m.start_ns) OVER w, CASE WHEN m.after_optimizer THEN r.last_ns ELSE e.last_ns END) AS end_ns,
           lead(m.start_ns) OVER w IS NOT NULL OR NOT m.after_optimizer AS finished
    FROM markers m LEFT JOIN step_ends e USING (rank, step) LEFT JOIN rank_ends r USING (rank)
    WINDOW w AS (PARTITION BY m.rank ORDER BY m.start_ns)
), profiled AS (
    SELECT rank, TRY_CAST(substr(name, 14) AS BIGINT) AS step, min(ts_ns) AS start_ns,
           max(ts_ns + dur_ns) AS end_ns
    FROM trace_events WHERE run_id = run AND ph = 'X' AND name LIKE 'ProfilerStep#%' GROUP BY ALL
), raw AS (
    SELECT rank, step, start_ns, end_ns, 'markers' AS source, finished FROM marked WHERE end_ns > start_ns
    UNION ALL
    SELECT rank, step, start_ns, end_ns, 'profiler', true FROM profiled
    WHERE step IS NOT NULL AND rank NOT IN (SELECT rank FROM markers)
)
SELECT r.rank, r.step, r.start_ns - coalesce(o.offset_ns, 0) AS start_ns, r.end_ns - coalesce(o.offset_ns, 0) AS end_ns,
       r.source, r.finished
FROM raw r LEFT JOIN rank_offsets(run) o USING (rank);

CREATE OR REPLACE MACRO run_fr_calls(run) AS TABLE
SELECT f.rank, f.pg_name, f.pg_desc, f.collective_seq_id AS seq, f.record_id,
       split_part(split_part(f.profiling_name, ':', 2), ' ', 1) AS op, f.profiling_name,
       coalesce(f.is_p2p, false) OR f.profiling_name LIKE '%:send %' OR f.profiling_name LIKE '%:recv %' AS is_p2p,
       coalesce(nullif(f.time_discovered_started_ns, 0), f.time_created_ns) - coalesce(o.offset_ns, 0) AS start_ns,
       nullif(f.time_discovered_completed_ns, 0) - coalesce(o.offset_ns, 0) AS end_ns,
       tensor_bytes(f.input_sizes, f.input_dtypes) AS bytes, f.state
FROM fr_entries_latest f LEFT JOIN rank_offsets(run) o USING (rank)
WHERE f.run_id = run;

-- Every span of every run, one row each, on each rank's own clock: X events as they are and
-- B/E pairs (rankstream.span, record_function) matched per thread the way a trace viewer nests
-- them. A B whose E never came (the rank died or is still inside it) ends at the rank's last
-- event and is flagged unfinished. For one run, filter on run_id (or use run_intervals(run),
-- which is also on the aligned clock).
CREATE OR REPLACE VIEW spans AS
WITH marks AS (
    SELECT run_id, rank, tid, name, cat, ph, ts_ns, step, args,
           sum(CASE WHEN ph = 'B' THEN 1 ELSE -1 END) OVER (
               PARTITION BY run_id, rank, tid ORDER BY ts_ns, ph DESC ROWS UNBOUNDED PRECEDING) AS depth
    FROM trace_events WHERE ph IN ('B', 'E')
), numbered AS (
    SELECT *, row_number() OVER (PARTITION BY run_id, rank, tid, level, ph ORDER BY ts_ns) AS nth
    FROM (SELECT *, CASE WHEN ph = 'B' THEN depth ELSE depth + 1 END AS level FROM marks)
), last_seen AS (
    SELECT run_id, rank, max(ts_ns + coalesce(dur_ns, 0)) AS last_ns FROM trace_events GROUP BY ALL
)
SELECT run_id, rank, step, name, cat, tid, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns, dur_ns,
       false AS unfinished, args
FROM trace_events WHERE ph = 'X' AND dur_ns >= 0
UNION ALL
SELECT b.run_id, b.rank, b.step, b.name, b.cat, b.tid, b.ts_ns, coalesce(e.ts_ns, l.last_ns),
       coalesce(e.ts_ns, l.last_ns) - b.ts_ns, e.ts_ns IS NULL, b.args
FROM numbered b
JOIN last_seen l USING (run_id, rank)
LEFT JOIN numbered e ON e.ph = 'E' AND e.run_id = b.run_id AND e.rank = b.rank AND e.tid = b.tid
     AND e.level = b.level AND e.nth = b.nth
WHERE b.ph = 'B';

-- HTA's kernel type, by name (docs/design.md, GPU analyses): Python's re.match of HTA 0.5.0's
-- patterns, anchored at the start only.
CREATE OR REPLACE MACRO kernel_type(name) AS CASE
    WHEN regexp_matches(name, '^nccl.*Kernel') THEN 'COMMUNICATION'
    WHEN regexp_matches(name, '^(Memcpy|Memset|dma)') THEN 'MEMORY'
    WHEN regexp_matches(name, '^(.*Memcpy|Memset|.*Sync)') THEN 'OTHER'
    ELSE 'COMPUTATION' END;

-- Nanoseconds rounded down / up to whole microseconds, in integers (doubles lose nanoseconds at epoch scale).
CREATE OR REPLACE MACRO ns_floor_us(ns) AS ns - ((ns % 1000) + 1000) % 1000;
CREATE OR REPLACE MACRO ns_ceil_us(ns) AS -ns_floor_us(-ns);

-- args.stream and args.correlation as HTA reads them: numbers only (ROCm's runtime calls carry
-- "stream": "0x0"); no stream is -1, no correlation is NULL (HTA's -1).
CREATE OR REPLACE MACRO hta_stream(args) AS coalesce(
    CASE WHEN json_type(args, '$.stream') IN ('UBIGINT', 'BIGINT') THEN (args->>'$.stream')::BIGINT END, -1);
CREATE OR REPLACE MACRO hta_correlation(args) AS
    CASE WHEN json_type(args, '$.correlation') IN ('UBIGINT', 'BIGINT') THEN (args->>'$.correlation')::BIGINT END;

-- Whether HTA's loader files an event as a GPU kernel when it drops the last step
-- (trace_filter._filter_gpu_kernels_with_cuda_sync): a stream and a correlation id, or a device-wide
-- sync. Everything else is a CPU event to that rule, a Triton cpu_op with a stream included.
CREATE OR REPLACE MACRO hta_loads_as_gpu(name, stream, correlation) AS
    (stream >= 0 AND coalesce(correlation, -1) >= 0) OR name IN ('Event Sync', 'Context Sync');

-- A run's complete events as Holistic Trace Analysis loads them (docs/design.md, GPU analyses), on
-- each rank's own clock. is_gpu is what HTA's analyses take as GPU work: an event with a stream.
-- Unless keep_last, the last profiler step is dropped as HTA's loader drops it, with its own split
-- of events (hta_loads_as_gpu): when the run has two or more ProfilerStep names, a rank's CPU
-- events are kept only if they started before the start of its last ProfilerStep (with keep_last:
-- by that step's end), and its GPU events only if a kept CPU event has their correlation id. A rank
-- with no ProfilerStep of its own is not cut (run_ranks_without_steps). Times of an imported file
-- with sub-microsecond times are put on the file's microsecond grid as HTA does (start rounded up,
-- end down), using the file's time base (trace_base_ns in rank_metadata).
CREATE OR REPLACE MACRO run_hta_events(run, keep_last) AS TABLE
WITH bases AS (
    SELECT rank, arg_max(TRY_CAST(metadata->>'$.trace_base_ns' AS BIGINT), sent_ns) AS base_ns
    FROM rank_metadata WHERE run_id = run AND metadata->>'$.trace_base_ns' IS NOT NULL GROUP BY rank
), gridded AS (  -- HTA rounds only a file whose times are not whole microseconds
    SELECT t.rank, b.base_ns FROM trace_events t JOIN bases b USING (rank)
    WHERE t.run_id = run GROUP BY ALL HAVING bool_or((t.ts_ns - b.base_ns) % 1000 <> 0)
), raw AS (
    SELECT t.rank, t.name, t.cat, t.ts_ns, t.dur_ns, t.args, g.base_ns
    FROM trace_events t LEFT JOIN gridded g USING (rank)
    WHERE t.run_id = run AND t.ph = 'X' AND t.dur_ns IS NOT NULL
), timed AS (
    SELECT rank, name, cat,
           CASE WHEN base_ns IS NULL THEN ts_ns ELSE base_ns + ns_ceil_us(ts_ns - base_ns) END AS ts_ns,
           CASE WHEN base_ns IS NULL THEN dur_ns
                ELSE ns_floor_us(ts_ns + dur_ns - base_ns) - ns_ceil_us(ts_ns - base_ns) END AS dur_ns,
           hta_stream(args) AS stream, hta_correlation(args) AS correlation, args
    FROM raw
), events AS (
    SELECT *, hta_loads_as_gpu(name, stream, correlation) AS loads_as_gpu FROM timed
), filtering AS (
    SELECT count(DISTINCT name) >= 2 AS applies FROM events WHERE name LIKE '%ProfilerStep%'
), cuts AS (  -- only ranks with a ProfilerStep of their own, only when the rule applies
    SELECT rank, max(ts_ns) AS last_step_ns, max(ts_ns + dur_ns) AS last_step_end_ns FROM events
    WHERE name LIKE '%ProfilerStep%' AND NOT loads_as_gpu AND (SELECT applies FROM filtering) GROUP BY rank
), judged AS (
    SELECT e.*, c.rank IS NOT NULL AS cut,
           CASE WHEN keep_last THEN e.ts_ns <= c.last_step_end_ns ELSE e.ts_ns < c.last_step_ns END AS before_cut
    FROM events e LEFT JOIN cuts c USING (rank)
), kept_cpu AS (
    SELECT * FROM judged WHERE NOT loads_as_gpu AND (NOT cut OR before_cut)
), launched AS (
    SELECT DISTINCT rank, correlation FROM kept_cpu WHERE correlation IS NOT NULL
), kept AS (
    SELECT * FROM kept_cpu
    UNION ALL
    SELECT * FROM judged WHERE loads_as_gpu AND (NOT cut OR (rank, correlation) IN (SELECT * FROM launched))
)
SELECT rank, name, cat, stream <> -1 AS is_gpu, kind AS kernel_type, stream, correlation, ts_ns AS start_ns,
       ts_ns + dur_ns AS end_ns,
       CASE WHEN kind = 'MEMORY' THEN TRY_CAST(args->>'$."memory bandwidth (GB/s)"' AS DOUBLE) END AS bandwidth_gb_s
FROM (SELECT *, CASE WHEN stream <> -1 THEN kernel_type(name) END AS kind FROM kept);

-- The ranks run_hta_events does not cut: the run has two or more ProfilerStep names, so the
-- last-step rule applies, but the rank has no ProfilerStep of its own to cut at. HTA fails on such
-- a run; here all their events count, as in a single file without steps, and the analyses say so.
CREATE OR REPLACE MACRO run_ranks_without_steps(run) AS TABLE
WITH steps AS (
    SELECT rank, name, hta_loads_as_gpu(name, hta_stream(args), hta_correlation(args)) AS loads_as_gpu
    FROM trace_events
    WHERE run_id = run AND ph = 'X' AND dur_ns IS NOT NULL AND name LIKE '%ProfilerStep%'
)
SELECT DISTINCT rank FROM trace_events
WHERE run_id = run AND ph = 'X' AND (SELECT count(DISTINCT name) FROM steps) >= 2
  AND rank NOT IN (SELECT rank FROM steps WHERE NOT loads_as_gpu)
ORDER BY rank;

-- The GPU events of run_hta_events: what the GPU breakdown analyses.
CREATE OR REPLACE MACRO run_gpu_events(run, keep_last) AS TABLE
SELECT rank, name, cat, kernel_type, stream, correlation, start_ns, end_ns, bandwidth_gb_s
FROM run_hta_events(run, keep_last) WHERE is_gpu;
