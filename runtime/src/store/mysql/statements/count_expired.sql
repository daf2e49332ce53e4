-- How many rows purge_expired.sql would evict.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
SELECT COUNT(*) FROM (SELECT ? AS caller_ms) AS p JOIN samekey_receipts r
WHERE r.expires_at <= UTC_TIMESTAMP(3)
