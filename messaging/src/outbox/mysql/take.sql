-- Locks up to ? of the heads heads.sql found, for the batch's transaction: those still unsent and
-- due (a locking read sees the latest commit: a head another relay marked sent or failed since the
-- plain read is left) and not held by another relay (skipped, never waited for).
-- A key's later rows are never taken: only heads are named. ?ids the heads' ids (one ? each), then
-- ? limit. Each row is found by its primary key, so that only the named rows are locked (a scan
-- would lock, or skip, every row it passed).
SELECT o.id, CONVERT(o.ordering_key USING utf8mb4) AS ordering_key,
    CONVERT(o.message_id USING utf8mb4) AS message_id,
    CONVERT(o.destination USING utf8mb4) AS destination, o.headers, o.body, o.attempts
FROM samekey_outbox o
WHERE o.id IN (?ids) AND o.sent IS NULL
    AND (o.next_at IS NULL OR o.next_at <= UTC_TIMESTAMP(3))
ORDER BY o.id
LIMIT ?
FOR UPDATE SKIP LOCKED
