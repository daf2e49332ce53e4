-- Rows still PROCESSING past their lease that no compensation entry covers, earliest lease first.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges. The last ? is the limit.
SELECT r.`key`, r.scope, r.call_id, r.state, r.fence,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.lease_until) DIV 1000 AS lease_until,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.expires_at) DIV 1000 AS expires_at,
    r.fingerprint, r.outcome,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.created) DIV 1000 AS created,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.updated) DIV 1000 AS updated
FROM (SELECT ? AS caller_ms) AS p JOIN samekey_receipts r
WHERE r.state = 'PROCESSING' AND r.lease_until <= UTC_TIMESTAMP(3)
    AND NOT EXISTS (SELECT 1 FROM samekey_compensation c WHERE c.call_id = r.call_id)
ORDER BY r.lease_until LIMIT ?
