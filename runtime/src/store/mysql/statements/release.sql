-- Gives a claim back (nothing ran): the row stays as a RELEASED tombstone, so that the key's next
-- claim continues its fence sequence. One row or none.
-- ? key, ? fence.
UPDATE samekey_receipts
SET state = 'RELEASED', lease_until = NULL, outcome = NULL, expires_at = updated
WHERE `key` = ? AND fence = ? AND state = 'PROCESSING'
