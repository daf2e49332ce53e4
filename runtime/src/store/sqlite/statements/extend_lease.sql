-- Extends the lease of the owner holding the fence: one row or none.
-- $1 lease (ms), $2 key, $3 fence, $4 now (ms).
UPDATE samekey_receipts SET lease_until = $4 + $1
WHERE key = $2 AND fence = $3 AND state = 'PROCESSING'
