-- Marks a key's live row waited-for, so that its next change notifies (the samekey_settled trigger),
-- and answers it.
-- $1 key, $2 the caller's time (unused: the server's clock judges).
UPDATE samekey_receipts SET waited = true
WHERE key = $1 AND (expires_at IS NULL OR expires_at > samekey_ts(samekey_now($2)))
RETURNING key, scope, call_id, state, fence, samekey_ms(lease_until) AS lease_until,
    samekey_ms(expires_at) AS expires_at, fingerprint, outcome, samekey_ms(created) AS created,
    samekey_ms(updated) AS updated
