-- Takes a key over: the row becomes PROCESSING under a new fence, its callId unchanged, if it still
-- carries the expected fence and is UNKNOWN or past its lease; answers the new fence, or no row.
-- $1 lease (ms), $2 the caller's time (unused: the server's clock judges), $3 key, $4 expected fence.
UPDATE samekey_receipts
SET state = 'PROCESSING', fence = nextval('samekey_fence'),
    lease_until = samekey_ts(samekey_now($2) + $1), updated = samekey_ts(samekey_now($2))
WHERE key = $3 AND fence = $4
    AND (state = 'UNKNOWN'
         OR (state IN ('RECEIVED', 'PROCESSING')
             AND (lease_until IS NULL OR lease_until <= samekey_ts(samekey_now($2)))))
RETURNING fence
