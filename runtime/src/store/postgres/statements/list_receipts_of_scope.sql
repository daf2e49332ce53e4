-- list_receipts.sql for one scope, on the (scope, created, key) index.
-- $1 until (ms), $2 the caller's time (unused: the server's clock judges), $3 cursor time (ms),
-- $4 cursor key, $5 scope, $6 limit.
SELECT key, scope, call_id, state, fence, samekey_ms(lease_until) AS lease_until,
    samekey_ms(expires_at) AS expires_at, fingerprint, outcome, samekey_ms(created) AS created,
    samekey_ms(updated) AS updated
FROM samekey_receipts
WHERE scope = $5 AND (created, key) > (samekey_ts($3), $4) AND created < samekey_ts($1)
    AND state <> 'RELEASED'
    AND (expires_at IS NULL OR expires_at > samekey_ts(samekey_now($2)))
ORDER BY samekey_receipts.created, key LIMIT $6
