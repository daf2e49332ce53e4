-- Records a call's outcome, if its owner still holds the key under the fence: one row or none.
-- $1 state (SUCCESS, FAILED), $2 outcome, $3 ttl (ms), $4 the caller's time (unused: the server's
-- clock judges), $5 key, $6 fence.
UPDATE samekey_receipts
SET state = $1, outcome = $2, lease_until = NULL,
    expires_at = samekey_ts(samekey_now($4) + $3), updated = samekey_ts(samekey_now($4))
WHERE key = $5 AND fence = $6 AND state IN ('RECEIVED', 'PROCESSING', 'UNKNOWN')
