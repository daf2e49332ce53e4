-- Rows still PROCESSING past their lease that no compensation entry covers, earliest lease first.
-- $1 now (ms), $2 limit.
SELECT key, scope, call_id, state, fence, lease_until, expires_at,
    fingerprint, outcome, created, updated
FROM samekey_receipts r WHERE state = 'PROCESSING' AND lease_until <= $1
    AND NOT EXISTS (SELECT 1 FROM samekey_compensation c WHERE c.call_id = r.call_id)
ORDER BY r.lease_until LIMIT $2
