-- Each history entry links to the previous entry of its key (HistoryEntry.chain_hash, computed
-- by the projector; toolledger.events.fold.chain_hash defines the bytes): sha256 over the
-- previous hash (raw bytes, none for a key's first entry), event_json, a newline, then
-- 'accepted <reason>' or 'rejected <reason>'. History written before this migration gets its
-- chains here, computed over the same bytes in log order, so `replay --verify` holds across
-- the upgrade. The append-only trigger is lifted for this one backfill and put back.
ALTER TABLE tool_execution_history ADD COLUMN chain_hash text;
ALTER TABLE tool_execution_history DISABLE TRIGGER tool_execution_history_append_only;
DO $$
DECLARE
    entry record;
    head bytea;
    head_key text;
BEGIN
    FOR entry IN
        SELECT key, partition, "offset", event_json, accepted, reason
        FROM tool_execution_history ORDER BY key, partition, "offset"
    LOOP
        IF head_key IS DISTINCT FROM entry.key THEN
            head := ''::bytea;
            head_key := entry.key;
        END IF;
        head := sha256(
            head || convert_to(entry.event_json, 'UTF8') || convert_to(
                E'\n' || CASE WHEN entry.accepted THEN 'accepted ' ELSE 'rejected ' END
                || entry.reason,
                'UTF8'
            )
        );
        UPDATE tool_execution_history SET chain_hash = encode(head, 'hex')
        WHERE partition = entry.partition AND "offset" = entry."offset";
    END LOOP;
END
$$;
ALTER TABLE tool_execution_history ENABLE TRIGGER tool_execution_history_append_only;
ALTER TABLE tool_execution_history ALTER COLUMN chain_hash SET NOT NULL;
