-- Takes a finished record back for a person's correction: the row becomes PROCESSING under a new
-- fence, its callId unchanged, its outcome and expiry cleared, if it still carries the expected fence
-- and is SUCCESS or FAILED; answers the new fence, or no row.
-- $1 lease (ms), $2 the caller's time (unused: the server's clock judges), $3 key, $4 expected fence.
UPDATE samekey_receipts
SET state = 'PROCESSING', fence = nextval('samekey_fence'), outcome = NULL, expires_at = NULL,
    lease_until = samekey_ts(samekey_now($2) + $1), updated = samekey_ts(samekey_now($2))
WHERE key = $3 AND fence = $4 AND state IN ('SUCCESS', 'FAILED')
RETURNING fence
