-- Payloads too large to travel inline in an event (toolledger.events.payloads): results,
-- arguments, operator values and run transcripts. The event carries the SHA-256 of the text
-- (its *_blob field, which the history's chain hash covers); the text is here, written before
-- the event that names it is appended. Content-addressed, so a resend writes nothing new.
-- The log holds only digests: back this table up with the rest of the ledger, and copy it
-- along when a replay builds a new schema (`toolledger replay --into` does).
CREATE TABLE payload_blobs (
    digest      text PRIMARY KEY,
    size        bigint NOT NULL,
    data        bytea NOT NULL,
    stored_at   timestamptz NOT NULL DEFAULT now()
);
-- Evidence, like the history: a blob is never changed or removed.
CREATE TRIGGER payload_blobs_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON payload_blobs
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_rewrite();

-- Records hold the references the decider copied from their events (NULL: the text is inline).
ALTER TABLE tool_executions ADD COLUMN arguments_blob text;
ALTER TABLE tool_executions ADD COLUMN result_blob text;
ALTER TABLE runs ADD COLUMN state_blob text;
