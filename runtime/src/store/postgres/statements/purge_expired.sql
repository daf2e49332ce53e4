-- Evicts the rows that expired.
-- $1 the caller's time (unused: the server's clock judges).
DELETE FROM samekey_receipts
WHERE expires_at IS NOT NULL AND expires_at <= samekey_ts(samekey_now($1))
