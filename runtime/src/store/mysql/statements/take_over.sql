-- Takes a key over: the row becomes PROCESSING under a new fence (its fence + 1, answered as the
-- statement's last insert id), its callId unchanged, if it still carries the expected fence and is
-- UNKNOWN or past its lease: one row or none.
-- ? lease (ms), ? key, ? expected fence. The server's clock judges.
UPDATE samekey_receipts
SET fence = LAST_INSERT_ID(fence + 1), state = 'PROCESSING',
    lease_until = UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND, updated = UTC_TIMESTAMP(3)
WHERE `key` = ? AND fence = ?
    AND (state = 'UNKNOWN'
         OR (state IN ('RECEIVED', 'PROCESSING')
             AND (lease_until IS NULL OR lease_until <= UTC_TIMESTAMP(3))))
