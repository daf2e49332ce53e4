-- The age of the oldest message that waits, in ms by the database's clock (no row: nothing waits).
SELECT CAST(round((julianday('now') - julianday(staged)) * 86400000) AS INTEGER)
FROM samekey_outbox WHERE sent IS NULL ORDER BY id LIMIT 1
