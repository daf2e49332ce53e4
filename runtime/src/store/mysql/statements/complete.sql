-- Records a call's outcome, if its owner still holds the key under the fence: one row or none.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
UPDATE samekey_receipts r
    JOIN (SELECT ? AS state, ? AS outcome, ? AS ttl_ms, ? AS caller_ms, ? AS k, ? AS fence) AS p
    ON r.`key` = p.k
SET r.state = p.state, r.outcome = p.outcome, r.lease_until = NULL,
    r.expires_at = UTC_TIMESTAMP(3) + INTERVAL p.ttl_ms * 1000 MICROSECOND, r.updated = UTC_TIMESTAMP(3)
WHERE r.fence = p.fence AND r.state IN ('RECEIVED', 'PROCESSING', 'UNKNOWN')
