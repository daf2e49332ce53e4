-- list_receipts.sql for one scope, on the (scope, created, key) index.
-- $1 until (ms), $2 now (ms), $3 cursor time (ms), $4 cursor key, $5 scope, $6 limit.
SELECT key, scope, call_id, state, fence, lease_until, expires_at,
    fingerprint, outcome, created, updated
FROM samekey_receipts
WHERE scope = $5 AND (created, key) > ($3, $4) AND created < $1 AND state <> 'RELEASED'
    AND (expires_at IS NULL OR expires_at > $2)
ORDER BY samekey_receipts.created, key LIMIT $6
