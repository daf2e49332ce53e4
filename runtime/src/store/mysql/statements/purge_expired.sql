-- Evicts the rows that expired, whose fence the floor covers (fence_floor.sql, just before).
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
DELETE r FROM samekey_receipts r JOIN (SELECT ? AS caller_ms) AS p
WHERE r.expires_at <= UTC_TIMESTAMP(3)
    AND r.fence <= (SELECT f.floor FROM samekey_fence f WHERE f.id = 1)
