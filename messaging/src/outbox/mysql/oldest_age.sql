-- The age of the oldest message that waits, in ms by the server's clock (no row: nothing waits).
SELECT TIMESTAMPDIFF(MICROSECOND, staged, UTC_TIMESTAMP(3)) DIV 1000
FROM samekey_outbox WHERE sent IS NULL ORDER BY id LIMIT 1
