-- Forgets a finished record (a person's decision), leaving a RELEASED tombstone as a release does.
-- One row or none.
-- $1 key, $2 fence.
UPDATE samekey_receipts
SET state = 'RELEASED', lease_until = NULL, outcome = NULL, expires_at = updated
WHERE key = $1 AND fence = $2 AND state IN ('SUCCESS', 'FAILED')
