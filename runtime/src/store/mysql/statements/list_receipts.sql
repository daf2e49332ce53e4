-- A page of the live receipts created in a range, in the order of (created, key), after a cursor (for
-- the first page: just before the range, since - 1 and all-ones). The bounds are converted, not the
-- column, so that the (created, key) index serves the range and the order.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
SELECT r.`key`, r.scope, r.call_id, r.state, r.fence,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.lease_until) DIV 1000 AS lease_until,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.expires_at) DIV 1000 AS expires_at,
    r.fingerprint, r.outcome,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.created) DIV 1000 AS created,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.updated) DIV 1000 AS updated
FROM (SELECT ? AS until_ms, ? AS caller_ms, ? AS after_ms, ? AS after_key) AS p
    JOIN samekey_receipts r
WHERE r.created >= TIMESTAMP '1970-01-01 00:00:00' + INTERVAL p.after_ms * 1000 MICROSECOND
    AND (r.created > TIMESTAMP '1970-01-01 00:00:00' + INTERVAL p.after_ms * 1000 MICROSECOND OR r.`key` > p.after_key)
    AND r.created < TIMESTAMP '1970-01-01 00:00:00' + INTERVAL p.until_ms * 1000 MICROSECOND AND r.state <> 'RELEASED'
    AND (r.expires_at IS NULL OR r.expires_at > UTC_TIMESTAMP(3))
ORDER BY r.created, r.`key` LIMIT ?
