-- Deletes up to ? messages sent more than keep_ms ago, oldest first. ? keep_ms, ? limit.
DELETE FROM samekey_outbox
WHERE sent IS NOT NULL AND sent < UTC_TIMESTAMP(3) - INTERVAL ? * 1000 MICROSECOND
ORDER BY sent
LIMIT ?
