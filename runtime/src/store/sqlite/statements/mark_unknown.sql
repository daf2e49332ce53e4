-- Marks a call's outcome UNKNOWN (kept until resolved), if its owner still holds the key under the
-- fence: one row or none.
-- $1 now (ms), $2 key, $3 fence.
UPDATE samekey_receipts
SET state = 'UNKNOWN', lease_until = NULL, expires_at = NULL, updated = $1
WHERE key = $2 AND fence = $3 AND state IN ('RECEIVED', 'PROCESSING')
