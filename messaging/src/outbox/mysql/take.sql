-- Locks up to ? of the heads heads.sql found, for the batch's transaction: those still unsent (a
-- locking read sees the latest commit) and not held by another relay (skipped, never waited for).
-- A key's later rows are never taken: only heads are named. ? the heads' ids, a JSON array, ? limit.
-- The ids drive the join and each row is found by its primary key, so that only the heads are
-- locked (a scan would lock, or skip, every row it passed).
SELECT o.id, o.ordering_key, o.message_id, o.destination, o.headers, o.body, o.attempts
FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS j
    STRAIGHT_JOIN samekey_outbox o ON o.id = j.id
WHERE o.sent IS NULL
ORDER BY o.id
LIMIT ?
FOR UPDATE SKIP LOCKED
