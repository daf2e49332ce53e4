-- A key's row, whatever its expiry.
-- $1 key.
SELECT key, scope, call_id, state, fence, samekey_ms(lease_until) AS lease_until,
    samekey_ms(expires_at) AS expires_at, fingerprint, outcome, samekey_ms(created) AS created,
    samekey_ms(updated) AS updated
FROM samekey_receipts WHERE key = $1
