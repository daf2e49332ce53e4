-- Takes a finished record back for a person's correction: the row becomes PROCESSING under a new
-- fence, its callId unchanged, its outcome and expiry cleared, if it still carries the expected fence
-- and is SUCCESS or FAILED; answers the new fence, or no row.
-- $1 lease (ms), $2 now (ms), $3 key, $4 expected fence.
UPDATE samekey_receipts
SET state = 'PROCESSING', fence = fence + 1, outcome = NULL, expires_at = NULL,
    lease_until = $2 + $1, updated = $2
WHERE key = $3 AND fence = $4 AND state IN ('SUCCESS', 'FAILED')
RETURNING fence
