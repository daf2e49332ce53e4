-- Extends the lease of the owner holding the fence: one row or none.
-- $1 lease (ms), $2 key, $3 fence, $4 the caller's time (unused: the server's clock judges).
UPDATE samekey_receipts SET lease_until = samekey_ts(samekey_now($4) + $1)
WHERE key = $2 AND fence = $3 AND state = 'PROCESSING'
