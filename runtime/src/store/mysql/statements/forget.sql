-- Forgets a finished record (a person's decision), leaving a RELEASED tombstone as a release does.
-- One row or none.
-- ? key, ? fence.
UPDATE samekey_receipts
SET state = 'RELEASED', lease_until = NULL, outcome = NULL, expires_at = updated
WHERE `key` = ? AND fence = ? AND state IN ('SUCCESS', 'FAILED')
