-- Rows still PROCESSING past their lease that no compensation entry covers, earliest lease first.
-- $1 the caller's time (unused: the server's clock judges), $2 limit.
SELECT key, scope, call_id, state, fence, samekey_ms(lease_until) AS lease_until,
    samekey_ms(expires_at) AS expires_at, fingerprint, outcome, samekey_ms(created) AS created,
    samekey_ms(updated) AS updated
FROM samekey_receipts r WHERE state = 'PROCESSING' AND lease_until <= samekey_ts(samekey_now($1))
    AND NOT EXISTS (SELECT 1 FROM samekey_compensation c WHERE c.call_id = r.call_id)
ORDER BY r.lease_until LIMIT $2
