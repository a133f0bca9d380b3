-- The projected ledger. Names are unqualified: the runner sets search_path to the ledger's schema.
-- JSON is kept as text so it reads back byte for byte (history and digests compare it exactly).
-- "offset" is quoted everywhere because OFFSET is a reserved word.

-- The current record per call key (CallRecord).
CREATE TABLE tool_executions (
    key                 text PRIMARY KEY,
    run_id              text NOT NULL,
    tool_call_id        text NOT NULL,
    tenant_id           text NOT NULL,
    tool                text NOT NULL,
    effect              text NOT NULL,
    status              text NOT NULL,
    version             integer NOT NULL,
    reservation_id      uuid NOT NULL,
    args_digest         text NOT NULL,
    arguments_json      text NOT NULL,
    requires_approval   boolean NOT NULL,
    deadline            timestamptz NOT NULL,
    not_attempted       boolean NOT NULL,
    result_json         text,
    result_reference    text,
    error               text,
    settled_by          text,
    operator            text,
    reason              text,
    reconcile_attempts  integer NOT NULL,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL
);
-- The operator queue: a tenant's calls in a status, oldest change first.
CREATE INDEX tool_executions_queue ON tool_executions (tenant_id, status, updated_at);
CREATE INDEX tool_executions_run ON tool_executions (run_id);

-- Every request with its verdict, accepted or rejected (HistoryEntry). Append-only.
CREATE TABLE tool_execution_history (
    key          text NOT NULL,
    event_id     uuid NOT NULL,
    event_type   text NOT NULL,
    partition    integer NOT NULL,
    "offset"     bigint NOT NULL,
    accepted     boolean NOT NULL,
    reason       text NOT NULL,
    detail       text NOT NULL,
    occurred_at  timestamptz NOT NULL,
    actor        text NOT NULL,
    version      integer,
    event_json   text NOT NULL,
    PRIMARY KEY (partition, "offset")
);
CREATE INDEX tool_execution_history_key ON tool_execution_history (key, partition, "offset");

-- The durable verdict of every event_id ever decided: what waiters read and facts publish.
-- Kept forever, so a resent event_id is recognised however late it comes.
CREATE TABLE verdicts (
    event_id      uuid PRIMARY KEY,
    partition     integer NOT NULL,
    "offset"      bigint NOT NULL,
    accepted      boolean NOT NULL,
    reason        text NOT NULL,
    verdict_json  text NOT NULL
);
-- The facts publisher reads a partition's verdicts in log order from its last published offset.
CREATE UNIQUE INDEX verdicts_position ON verdicts (partition, "offset");

-- One row per run (RunRecord): its tenant, fencing version and quarantine.
CREATE TABLE runs (
    run_id             text PRIMARY KEY,
    tenant_id          text,
    version            integer,
    status             text NOT NULL,
    agent              text NOT NULL,
    checkpoint_calls   text[] NOT NULL,
    state_json         text NOT NULL,
    waiting_on         text,
    abandoned          text[] NOT NULL,
    quarantined        boolean NOT NULL,
    quarantine_reason  text,
    updated_at         timestamptz
);

-- The projector's position per partition, committed with the rows (the compare-and-set fence),
-- and the log identity it was taken from.
CREATE TABLE projection_offsets (
    partition    integer PRIMARY KEY,
    next_offset  bigint NOT NULL,
    epoch        uuid NOT NULL,
    partitions   integer NOT NULL
);

-- Log records that could not be decoded; their runs are quarantined.
CREATE TABLE dead_letters (
    partition    integer NOT NULL,
    "offset"     bigint NOT NULL,
    run_id       text,
    reason       text NOT NULL,
    payload      bytea NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition, "offset")
);

-- The last offset per partition whose verdict was published to the facts topic.
CREATE TABLE facts_offsets (
    partition         integer PRIMARY KEY,
    published_offset  bigint NOT NULL
);

-- History and verdicts are evidence: refuse to change or remove them (a statement-level
-- trigger, so inserts pay nothing). Erasure, when it comes, is an event.
CREATE FUNCTION refuse_rewrite() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP;
END
$$;
CREATE TRIGGER tool_execution_history_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON tool_execution_history
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_rewrite();
CREATE TRIGGER verdicts_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON verdicts
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_rewrite();
