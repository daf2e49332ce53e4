-- A page of the live receipts created in a range, in the order of (created, key), after a cursor (for
-- the first page: just before the range, `since - 1` and all-ones). The bounds are converted, not the
-- column, so that the (created, key) index serves the range and the order.
-- $1 until (ms), $2 the caller's time (unused: the server's clock judges), $3 cursor time (ms),
-- $4 cursor key, $5 limit.
SELECT key, scope, call_id, state, fence, samekey_ms(lease_until) AS lease_until,
    samekey_ms(expires_at) AS expires_at, fingerprint, outcome, samekey_ms(created) AS created,
    samekey_ms(updated) AS updated
FROM samekey_receipts
WHERE (created, key) > (samekey_ts($3), $4) AND created < samekey_ts($1) AND state <> 'RELEASED'
    AND (expires_at IS NULL OR expires_at > samekey_ts(samekey_now($2)))
ORDER BY samekey_receipts.created, key LIMIT $5
