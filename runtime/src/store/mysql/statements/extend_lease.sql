-- Extends the lease of the owner holding the fence: one row or none.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional).
UPDATE samekey_receipts r
    JOIN (SELECT ? AS lease_ms, ? AS k, ? AS fence, ? AS caller_ms) AS p ON r.`key` = p.k
SET r.lease_until = UTC_TIMESTAMP(3) + INTERVAL p.lease_ms * 1000 MICROSECOND
WHERE r.fence = p.fence AND r.state = 'PROCESSING'
