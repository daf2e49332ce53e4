-- Evicts the rows that expired.
-- $1 now (ms).
DELETE FROM samekey_receipts WHERE expires_at IS NOT NULL AND expires_at <= $1
