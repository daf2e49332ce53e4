-- Takes a finished record back for a person's correction: the row becomes PROCESSING under a new
-- fence (its fence + 1, answered as the statement's last insert id), its callId unchanged, its outcome
-- and expiry cleared, if it still carries the expected fence and is SUCCESS or FAILED: one row or none.
-- ? lease (ms), ? key, ? expected fence. The server's clock judges.
UPDATE samekey_receipts
SET fence = LAST_INSERT_ID(fence + 1), state = 'PROCESSING', outcome = NULL, expires_at = NULL,
    lease_until = UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND, updated = UTC_TIMESTAMP(3)
WHERE `key` = ? AND fence = ? AND state IN ('SUCCESS', 'FAILED')
