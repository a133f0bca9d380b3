-- A settled call whose late outcome contradicts how an operator or a reconcile hook settled it
-- is contested (CallRecord.contested, decider rules v2): a flag beside the status, with the
-- evidence that arrived. Every call projected before this migration was folded by the v1
-- rules, which never contest, so false is the value a replay gives them too.
ALTER TABLE tool_executions ADD COLUMN contested boolean NOT NULL DEFAULT false;
ALTER TABLE tool_executions ADD COLUMN contested_evidence text;
-- The operator queue lists contested calls (`?contested=true`); they are few, so a partial
-- index in the queue's order.
CREATE INDEX tool_executions_contested ON tool_executions (tenant_id, updated_at, key)
    WHERE contested;
