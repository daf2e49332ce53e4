-- The messages sent more than keep_ms ago, oldest first, up to ?: a plain read (no lock), whose rows
-- purge.sql then deletes by primary key. ? keep_ms, ? limit.
SELECT id FROM samekey_outbox
WHERE sent IS NOT NULL AND sent < UTC_TIMESTAMP(3) - INTERVAL ? * 1000 MICROSECOND
ORDER BY sent
LIMIT ?
