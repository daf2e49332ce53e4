-- A key's row as last committed, whatever its expiry, read after a refused completion to say why:
-- a locking read, which sees the latest commit inside the caller's transaction too (whose
-- REPEATABLE READ snapshot may predate the take-over that refused it). In a transaction the refused
-- UPDATE already holds the row's lock; in autocommit the read waits at most for a transaction that
-- is writing the row. ? key.
SELECT r.`key`, r.scope, r.call_id, r.state, r.fence,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.lease_until) DIV 1000 AS lease_until,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.expires_at) DIV 1000 AS expires_at,
    r.fingerprint, r.outcome,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.created) DIV 1000 AS created,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.updated) DIV 1000 AS updated
FROM samekey_receipts r WHERE r.`key` = ?
LOCK IN SHARE MODE
