-- Every materialized table: a projection of the bus topics that `rankstream consume --rebuild`
-- recreates from offset 0. Data tables carry run_id and rank. Times are epoch nanoseconds (BIGINT)
-- so they join without conversion; wrap them in make_timestamp_ns() for display.

-- One row per trace event (profiler ops, user spans, instants, counters, step markers).
CREATE TABLE IF NOT EXISTS trace_events (
    run_id          VARCHAR NOT NULL,
    rank            INTEGER NOT NULL,
    name            VARCHAR,
    cat             VARCHAR,
    ph              VARCHAR,   -- Chrome trace phase: X, B, E, i, C, M, s, f, ...
    ts_ns           BIGINT,
    dur_ns          BIGINT,
    pid             BIGINT,
    tid             BIGINT,
    step            BIGINT,    -- training step (ProfilerStep#N or rankstream.step()), NULL if unknown
    flow_id         BIGINT,
    correlation_id  BIGINT,
    args            VARCHAR    -- JSON text; query with args->>'$.key' or json_extract(args, ...)
);

-- One row per Flight Recorder entry state seen (an entry re-sent with a new state adds a row;
-- fr_entries_latest keeps the newest per record).
CREATE TABLE IF NOT EXISTS fr_entries (
    run_id                        VARCHAR NOT NULL,
    rank                          INTEGER NOT NULL,
    snapshot_ns                   BIGINT,
    record_id                     BIGINT NOT NULL,
    pg_id                         BIGINT,
    pg_name                       VARCHAR,
    pg_desc                       VARCHAR,
    thread_name                   VARCHAR,
    thread_id                     VARCHAR,
    collective_seq_id             BIGINT,
    p2p_seq_id                    BIGINT,
    op_id                         BIGINT,
    profiling_name                VARCHAR NOT NULL,
    time_created_ns               BIGINT,
    time_discovered_started_ns    BIGINT,
    time_discovered_completed_ns  BIGINT,
    input_sizes                   BIGINT[][],
    input_dtypes                  VARCHAR[],
    output_sizes                  BIGINT[][],
    output_dtypes                 VARCHAR[],
    state                         VARCHAR,
    retired                       BOOLEAN,
    timeout_ms                    BIGINT,
    is_p2p                        BOOLEAN,
    frames                        STRUCT(name VARCHAR, filename VARCHAR, line BIGINT)[]
);

-- Process groups as each rank reported them. ranks is NULL when the backend did not list them.
CREATE TABLE IF NOT EXISTS process_groups (
    run_id       VARCHAR NOT NULL,
    rank         INTEGER NOT NULL,
    reported_ns  BIGINT,
    pg_name      VARCHAR NOT NULL,
    pg_desc      VARCHAR,
    ranks        INTEGER[],
    backend      VARCHAR
);

-- One row per producer heartbeat (about one per second per rank), with the producer's counters.
CREATE TABLE IF NOT EXISTS heartbeats (
    run_id           VARCHAR NOT NULL,
    rank             INTEGER NOT NULL,
    session_id       VARCHAR NOT NULL,
    sent_ns          BIGINT NOT NULL,
    events_emitted   BIGINT,
    events_sent      BIGINT,
    events_spooled   BIGINT,
    events_dropped   BIGINT,
    bytes_sent       BIGINT,
    buffered_events  BIGINT,
    spool_bytes      BIGINT,
    final            BOOLEAN,
    collectives      VARCHAR,  -- JSON: last enqueued/started/completed collective per group
    broker_resets    BIGINT,   -- broker restarts the producer noticed (it lost its log each time)
    events_resent    BIGINT,   -- events resent from the resend window after those restarts
    events_not_resent BIGINT   -- events the window's byte cap had already let go: lost if unconsumed
);
-- Databases created before the broker-restart counters existed get the columns.
ALTER TABLE heartbeats ADD COLUMN IF NOT EXISTS broker_resets BIGINT;
ALTER TABLE heartbeats ADD COLUMN IF NOT EXISTS events_resent BIGINT;
ALTER TABLE heartbeats ADD COLUMN IF NOT EXISTS events_not_resent BIGINT;

-- Every rank-metadata message (a rank re-sends it with each new clock-sync sample).
CREATE TABLE IF NOT EXISTS rank_metadata (
    run_id            VARCHAR NOT NULL,
    rank              INTEGER NOT NULL,
    world_size        INTEGER,
    session_id        VARCHAR NOT NULL,
    sent_ns           BIGINT NOT NULL,
    host              VARCHAR,
    pid               BIGINT,
    started_at_ns     BIGINT,
    local_rank        INTEGER,
    node_rank         INTEGER,
    local_world_size  INTEGER,
    torch_version     VARCHAR,
    backend           VARCHAR,
    backend_version   VARCHAR,
    clock_sync_ns     BIGINT,
    clock_error_ns    BIGINT,
    metadata          VARCHAR,  -- JSON given to the producer by the user
    clock_round       INTEGER   -- which clock-sync round clock_sync_ns belongs to (same on every rank)
);
-- Databases created before clock_round existed get the column (NULL: rounds matched by order).
ALTER TABLE rank_metadata ADD COLUMN IF NOT EXISTS clock_round INTEGER;

-- Messages that could not be decoded or validated: where they were and why. Nothing is lost:
-- raw holds the exact bytes.
CREATE TABLE IF NOT EXISTS rejects (
    topic         VARCHAR NOT NULL,
    partition     INTEGER NOT NULL,
    kafka_offset  BIGINT NOT NULL,
    message_key   BLOB,
    message_ts_ms BIGINT,
    run_id        VARCHAR,
    rank          INTEGER,
    reason        VARCHAR NOT NULL,
    raw           BLOB
);

-- Derived by the collective analysis (rankstream analyze collectives / diagnose), one run at a
-- time; memberships, collective_calls and collectives are rebuilt with it (see flows/collectives.py).
CREATE TABLE IF NOT EXISTS findings (
    run_id          VARCHAR NOT NULL,
    position        INTEGER NOT NULL,   -- reporting order: first mismatch first
    kind            VARCHAR NOT NULL,   -- type_mismatch, extra_collective, skipped_collective, size_mismatch, ...
    pg_name         VARCHAR,
    pg_desc         VARCHAR,
    seq             BIGINT,             -- collective_seq_id
    culprit_ranks   INTEGER[],
    ranks_involved  INTEGER[],
    expected        VARCHAR,            -- JSON
    actual          VARCHAR,            -- JSON
    detail          VARCHAR
);

-- Written every couple of seconds by the live hang detector beside the materializer: the current
-- hangs and dead ranks of runs that are still heartbeating (rows of a run are replaced each pass).
CREATE TABLE IF NOT EXISTS live_findings (
    run_id          VARCHAR NOT NULL,
    detected_ns     BIGINT NOT NULL,
    kind            VARCHAR NOT NULL,   -- hang, mismatched_collective, stuck_collective or dead_rank
    pg_name         VARCHAR,
    seq             BIGINT,             -- the collective the other ranks wait in
    op              VARCHAR,
    since_ns        BIGINT,             -- when the group stopped progressing (or the last heartbeat)
    culprit_ranks   INTEGER[],
    waiting_ranks   INTEGER[],
    detail          VARCHAR             -- JSON: each culprit's last enqueued/completed, heartbeat, stack
);

-- Bookkeeping, written in the same transaction as the rows above.
-- One row per accepted message: resends of a batch (same key) are skipped.
CREATE TABLE IF NOT EXISTS ingested_batches (
    run_id        VARCHAR NOT NULL,
    rank          INTEGER NOT NULL,
    stream        VARCHAR NOT NULL,
    session_id    VARCHAR NOT NULL,
    seq           BIGINT NOT NULL,
    kind          VARCHAR NOT NULL,
    events        BIGINT NOT NULL,
    topic         VARCHAR NOT NULL,
    partition     INTEGER NOT NULL,
    kafka_offset  BIGINT NOT NULL
);

-- The topic ids of the broker incarnation the offsets belong to (see deploy/kafka.py). A broker
-- that lost its log recreates the topics with new ids and restarts offsets at 0.
CREATE TABLE IF NOT EXISTS bus_incarnation (
    topic     VARCHAR PRIMARY KEY,
    topic_id  VARCHAR NOT NULL
);

-- The next offset to read per partition.
CREATE TABLE IF NOT EXISTS consumer_offsets (
    topic        VARCHAR NOT NULL,
    partition    INTEGER NOT NULL,
    next_offset  BIGINT NOT NULL,
    PRIMARY KEY (topic, partition)
);

-- Views: derived, so they are identical whatever order a replay delivers partitions in.
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
)
SELECT s.run_id,
       make_timestamp(s.started_at_ns // 1000) AS started_at,
       CASE WHEN f.final_ranks >= s.world_size THEN make_timestamp(f.last_final_ns // 1000) END AS ended_at,
       s.world_size,
       s.metadata
FROM started s LEFT JOIN finished f USING (run_id);

CREATE OR REPLACE VIEW fr_entries_latest AS
SELECT * FROM fr_entries
QUALIFY row_number() OVER (PARTITION BY run_id, rank, record_id ORDER BY snapshot_ns DESC) = 1;

-- ---------------------------------------------------------------------------------------------
-- Derived by the analysis flows (flows/merge.py, flows/steps.py, flows/comms.py, flows/breakdown.py).
-- Each analysis replaces one run's rows in one transaction, so these tables can hold many runs and
-- a run can be re-analyzed while its data keeps arriving.

-- Per-rank clock offsets: rank's clock minus the reference rank's clock, from every source that
-- had data (barrier clock sync, profiler step starts, Flight Recorder completions); the one used
-- for alignment has chosen = true. The true offset lies within offset_ns +- error_ns.
CREATE TABLE IF NOT EXISTS clock_offsets (
    run_id          VARCHAR NOT NULL,
    rank            INTEGER NOT NULL,
    reference_rank  INTEGER NOT NULL,
    source          VARCHAR NOT NULL,   -- barrier, flight_recorder, profiler_steps, none
    offset_ns       BIGINT,
    error_ns        BIGINT,             -- NULL when the source gives no bound
    samples         BIGINT,
    chosen          BOOLEAN NOT NULL,
    detail          VARCHAR
);

-- All ranks' trace events on the reference rank's clock: pid is the rank, flow and correlation ids
-- are namespaced by rank (rank << 40 | id) so they never collide across ranks.
CREATE OR REPLACE VIEW aligned_events AS
SELECT e.run_id, e.rank, e.name, e.cat, e.ph,
       e.ts_ns - coalesce(o.offset_ns, 0) AS ts_ns, e.dur_ns,
       e.rank::BIGINT AS pid, e.pid AS os_pid, e.tid, e.step,
       (e.rank::BIGINT << 40) | e.flow_id AS flow_id,
       (e.rank::BIGINT << 40) | e.correlation_id AS correlation_id,
       e.args
FROM trace_events e
LEFT JOIN clock_offsets o ON o.run_id = e.run_id AND o.rank = e.rank AND o.chosen;

-- One row per (run, rank, step), like MindSpore's step_trace_time: the step's span and how it
-- splits into phases (each phase is the union of its intervals inside the step, so nested spans
-- are not counted twice), plus MindSpore's iteration interval / fp+bp / tail.
CREATE TABLE IF NOT EXISTS step_trace (
    run_id                 VARCHAR NOT NULL,
    rank                   INTEGER NOT NULL,
    step                   BIGINT NOT NULL,
    start_ns               BIGINT NOT NULL,   -- aligned clock
    end_ns                 BIGINT NOT NULL,
    duration_ns            BIGINT NOT NULL,
    data_ns                BIGINT,
    forward_ns             BIGINT,
    backward_ns            BIGINT,
    optimizer_ns           BIGINT,
    communication_ns       BIGINT,
    other_ns               BIGINT,            -- in no phase: Python overhead, sleeps, unannotated work
    busy_ns                BIGINT,            -- duration minus communication: what peers may wait for
    iteration_interval_ns  BIGINT,            -- step start to first forward
    fp_bp_ns               BIGINT,            -- first forward start to last backward end
    tail_ns                BIGINT,            -- last backward end to step end
    slowest_order          INTEGER            -- 1 = the rank with the most busy time in this step
);

-- Per (run, rank): how often and by how much the rank is the slowest (HTA's straggler view).
CREATE TABLE IF NOT EXISTS rank_slowness (
    run_id             VARCHAR NOT NULL,
    rank               INTEGER NOT NULL,
    steps              BIGINT,
    mean_step_ns       DOUBLE,
    mean_busy_ns       DOUBLE,
    busy_vs_median     DOUBLE,   -- mean busy time / the median rank's mean busy time
    times_slowest      BIGINT,
    ranking            INTEGER   -- 1 = slowest overall
);

-- Per (run, group, op) from the Flight Recorder entries: counts, times, sizes and bandwidth; wait
-- is the time a rank spent in the collective before its last peer arrived, transfer the rest.
CREATE TABLE IF NOT EXISTS comm_summary (
    run_id           VARCHAR NOT NULL,
    pg_name          VARCHAR,
    pg_desc          VARCHAR,
    op               VARCHAR NOT NULL,
    calls            BIGINT,    -- distinct collectives (p2p: operations)
    rank_entries     BIGINT,
    total_ns         BIGINT,    -- summed over ranks
    mean_ns          DOUBLE,
    total_bytes      BIGINT,    -- summed over ranks
    mean_bytes       DOUBLE,
    bandwidth_gb_s   DOUBLE,    -- mean bytes / mean time per rank entry (algorithm bandwidth)
    wait_ns          BIGINT,
    transfer_ns      BIGINT,
    time_source      VARCHAR    -- flight_recorder (start/complete times), profiler (gloo: the backend's
                                -- spans in profiled steps, scaled to all calls) or NULL (no timing)
);

-- rank x rank traffic, like MindSpore's communication_matrix. p2p: each send from src to dst.
-- Collectives: each member's bytes split evenly over the group's other members.
CREATE TABLE IF NOT EXISTS comm_matrix (
    run_id          VARCHAR NOT NULL,
    kind            VARCHAR NOT NULL,   -- p2p or collective
    src_rank        INTEGER NOT NULL,
    dst_rank        INTEGER NOT NULL,
    ops             BIGINT,
    bytes           DOUBLE,
    time_ns         DOUBLE,
    bandwidth_gb_s  DOUBLE
);

-- Per (run, rank), HTA's temporal breakdown: compute, communication, both at once, and idle.
CREATE TABLE IF NOT EXISTS temporal_breakdown (
    run_id              VARCHAR NOT NULL,
    rank                INTEGER NOT NULL,
    span_ns             BIGINT,
    compute_ns          BIGINT,
    communication_ns    BIGINT,
    overlap_ns          BIGINT,    -- computing while communicating
    idle_ns             BIGINT,
    compute_pct         DOUBLE,
    communication_pct   DOUBLE,
    idle_pct            DOUBLE,
    overlap_pct_of_comm DOUBLE
);

-- Per (run, op name): time per rank and its spread across ranks (HTA's top kernels, per rank).
CREATE TABLE IF NOT EXISTS op_stats (
    run_id        VARCHAR NOT NULL,
    name          VARCHAR NOT NULL,
    ranks         BIGINT,
    calls         BIGINT,
    total_ns      BIGINT,     -- all ranks
    mean_rank_ns  DOUBLE,     -- per rank
    min_rank_ns   BIGINT,
    max_rank_ns   BIGINT,
    max_rank      INTEGER,
    spread        DOUBLE,     -- (max - min) / mean over ranks
    position      INTEGER     -- 1 = most total time
);

-- Which analyses ran for which run (the end-of-run trigger runs each once per finished run).
CREATE TABLE IF NOT EXISTS analyses_done (
    run_id        VARCHAR NOT NULL,
    analysis      VARCHAR NOT NULL,
    finished_ns   BIGINT NOT NULL,
    detail        VARCHAR
);

-- ---------------------------------------------------------------------------------------------
-- Macros the analyses share (and SQL users may call).

-- The phase of a span or op, from its name: communication, optimizer, backward, data, forward or
-- NULL. Annotations (rankstream.span, record_function) and torch's own names both match.
CREATE OR REPLACE MACRO event_phase(name) AS CASE
    WHEN regexp_matches(lower(name), 'all_?reduce|all_?gather|reduce_?scatter|broadcast|barrier|all_?to_?all|nccl|gloo|c10d::|\bsend\b|\brecv\b|isend|irecv|communicat')
        THEN 'communication'
    WHEN regexp_matches(lower(name), 'optimizer|optim\.|zero_grad') THEN 'optimizer'
    WHEN regexp_matches(lower(name), 'backward|autograd::engine') THEN 'backward'
    WHEN regexp_matches(lower(name), 'dataloader|data_loader|^data$|^data[ _:.]|load_batch|next_batch|get_batch') THEN 'data'
    WHEN regexp_matches(lower(name), 'forward|^fwd\b') THEN 'forward'
END;

-- Bytes of a Flight Recorder entry's tensors: sizes (one shape per tensor) times element size.
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

-- A run's chosen clock offset per rank (0 until the merge has run).
CREATE OR REPLACE MACRO rank_offsets(run) AS TABLE
SELECT rank, offset_ns FROM clock_offsets WHERE run_id = run AND chosen;

-- A run's B/E pairs as intervals on each rank's own clock, matched per thread the way a trace viewer
-- nests them (an E closes the innermost open B). A B whose E never came (the rank died or is still
-- inside it) ends at the rank's last event, flagged unfinished. A filter on rank reaches the scans.
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

-- Every span of a run as an interval on each rank's own clock: X events as they are, and the B/E
-- pairs. What needs only lengths (unions) or one rank at a time can skip moving every event.
CREATE OR REPLACE MACRO run_own_intervals(run) AS TABLE
SELECT rank, tid, name, cat, ts_ns AS start_ns, ts_ns + dur_ns AS end_ns, step, false AS unfinished, args
FROM trace_events WHERE run_id = run AND ph = 'X' AND dur_ns >= 0
UNION ALL
SELECT * FROM run_span_pairs(run);

-- The same intervals on the aligned clock.
CREATE OR REPLACE MACRO run_intervals(run) AS TABLE
SELECT r.rank, r.tid, r.name, r.cat, r.start_ns - coalesce(o.offset_ns, 0) AS start_ns,
       r.end_ns - coalesce(o.offset_ns, 0) AS end_ns, r.step, r.unfinished, r.args
FROM run_own_intervals(run) r LEFT JOIN rank_offsets(run) o USING (rank);

-- A run's training steps per rank on the aligned clock: from rankstream.step() markers (a step
-- lasts until the next marker; the last one until its last event), or else from ProfilerStep#N.
CREATE OR REPLACE MACRO run_steps(run) AS TABLE
WITH markers AS (
    SELECT rank, step, min(ts_ns) AS start_ns FROM trace_events
    WHERE run_id = run AND ph = 'i' AND cat = 'step' AND name = 'step' AND step IS NOT NULL GROUP BY ALL
), step_ends AS (
    SELECT rank, step, max(ts_ns + coalesce(dur_ns, 0)) AS last_ns FROM trace_events
    WHERE run_id = run AND step IS NOT NULL GROUP BY ALL
), marked AS (
    SELECT m.rank, m.step, m.start_ns,
           coalesce(lead(m.start_ns) OVER (PARTITION BY m.rank ORDER BY m.start_ns), e.last_ns) AS end_ns
    FROM markers m LEFT JOIN step_ends e USING (rank, step)
), profiled AS (
    SELECT rank, TRY_CAST(substr(name, 14) AS BIGINT) AS step, min(ts_ns) AS start_ns,
           max(ts_ns + dur_ns) AS end_ns
    FROM trace_events WHERE run_id = run AND ph = 'X' AND name LIKE 'ProfilerStep#%' GROUP BY ALL
), raw AS (
    SELECT rank, step, start_ns, end_ns, 'markers' AS source FROM marked WHERE end_ns > start_ns
    UNION ALL
    SELECT rank, step, start_ns, end_ns, 'profiler' FROM profiled
    WHERE step IS NOT NULL AND rank NOT IN (SELECT rank FROM markers)
)
SELECT r.rank, r.step, r.start_ns - coalesce(o.offset_ns, 0) AS start_ns, r.end_ns - coalesce(o.offset_ns, 0) AS end_ns,
       r.source
FROM raw r LEFT JOIN rank_offsets(run) o USING (rank);

-- A run's Flight Recorder entries (newest state of each), on the aligned clock, with their bytes.
CREATE OR REPLACE MACRO run_fr_calls(run) AS TABLE
SELECT f.rank, f.pg_name, f.pg_desc, f.collective_seq_id AS seq, f.record_id,
       split_part(split_part(f.profiling_name, ':', 2), ' ', 1) AS op, f.profiling_name,
       coalesce(f.is_p2p, false) OR f.profiling_name LIKE '%:send %' OR f.profiling_name LIKE '%:recv %' AS is_p2p,
       coalesce(nullif(f.time_discovered_started_ns, 0), f.time_created_ns) - coalesce(o.offset_ns, 0) AS start_ns,
       nullif(f.time_discovered_completed_ns, 0) - coalesce(o.offset_ns, 0) AS end_ns,
       tensor_bytes(f.input_sizes, f.input_dtypes) AS bytes, f.state
FROM fr_entries_latest f LEFT JOIN rank_offsets(run) o USING (rank)
WHERE f.run_id = run;
