-- The age of the oldest message that waits, in ms by the server's clock (no row: nothing waits).
SELECT (extract(epoch FROM statement_timestamp() - staged) * 1000)::BIGINT
FROM samekey_outbox WHERE sent IS NULL ORDER BY id LIMIT 1
