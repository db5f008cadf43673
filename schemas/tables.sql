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
    collectives      VARCHAR   -- JSON: last enqueued/started/completed collective per group
);

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
    metadata          VARCHAR   -- JSON given to the producer by the user
);

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
    kind            VARCHAR NOT NULL,   -- hang or dead_rank
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
