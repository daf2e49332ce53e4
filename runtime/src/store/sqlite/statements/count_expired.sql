-- How many rows purge_expired.sql would evict.
-- $1 now (ms).
SELECT COUNT(*) FROM samekey_receipts WHERE expires_at IS NOT NULL AND expires_at <= $1
