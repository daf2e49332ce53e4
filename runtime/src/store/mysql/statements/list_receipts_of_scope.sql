-- list_receipts.sql for one scope, on the (scope_digest, created, key) index: the scope's
-- SHA-256 finds its rows, and the scope itself, as binary, confirms them byte for byte.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
SELECT r.`key`, r.scope, r.call_id, r.state, r.fence,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.lease_until) DIV 1000 AS lease_until,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.expires_at) DIV 1000 AS expires_at,
    r.fingerprint, r.outcome,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.created) DIV 1000 AS created,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.updated) DIV 1000 AS updated
FROM (SELECT ? AS until_ms, ? AS caller_ms, ? AS after_ms, ? AS after_key, ? AS scope) AS p
    JOIN samekey_receipts r
WHERE r.scope_digest = UNHEX(SHA2(p.scope, 256)) AND BINARY r.scope = BINARY p.scope
    AND r.created >= TIMESTAMP '1970-01-01 00:00:00' + INTERVAL p.after_ms * 1000 MICROSECOND
    AND (r.created > TIMESTAMP '1970-01-01 00:00:00' + INTERVAL p.after_ms * 1000 MICROSECOND OR r.`key` > p.after_key)
    AND r.created < TIMESTAMP '1970-01-01 00:00:00' + INTERVAL p.until_ms * 1000 MICROSECOND AND r.state <> 'RELEASED'
    AND (r.expires_at IS NULL OR r.expires_at > UTC_TIMESTAMP(3))
ORDER BY r.created, r.`key` LIMIT ?
