-- A key's row, unless it expired.
-- $1 key, $2 the caller's time (unused: the server's clock judges).
SELECT key, scope, call_id, state, fence, samekey_ms(lease_until) AS lease_until,
    samekey_ms(expires_at) AS expires_at, fingerprint, outcome, samekey_ms(created) AS created,
    samekey_ms(updated) AS updated
FROM samekey_receipts WHERE key = $1 AND (expires_at IS NULL OR expires_at > samekey_ts(samekey_now($2)))
