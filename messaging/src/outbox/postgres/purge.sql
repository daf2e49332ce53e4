-- Deletes up to $2 messages sent more than $1 ms ago.
DELETE FROM samekey_outbox WHERE id IN (
    SELECT id FROM samekey_outbox
    WHERE sent IS NOT NULL AND sent < statement_timestamp() - $1 * INTERVAL '1 millisecond'
    LIMIT $2)
