-- Marks a call's outcome UNKNOWN (kept until resolved), if its owner still holds the key under the
-- fence: one row or none.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
UPDATE samekey_receipts r JOIN (SELECT ? AS caller_ms, ? AS k, ? AS fence) AS p ON r.`key` = p.k
SET r.state = 'UNKNOWN', r.lease_until = NULL, r.expires_at = NULL, r.updated = UTC_TIMESTAMP(3)
WHERE r.fence = p.fence AND r.state IN ('RECEIVED', 'PROCESSING')
