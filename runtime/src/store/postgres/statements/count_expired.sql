-- How many rows purge_expired.sql would evict.
-- $1 the caller's time (unused: the server's clock judges).
SELECT COUNT(*) FROM samekey_receipts
WHERE expires_at IS NOT NULL AND expires_at <= samekey_ts(samekey_now($1))
