-- The records some callIds hold (not released ones), in any order.
-- $1 the callIds, as a JSON array of strings.
SELECT key, scope, call_id, state, fence, lease_until, expires_at,
    fingerprint, outcome, created, updated
FROM samekey_receipts
WHERE call_id IN (SELECT value FROM json_each($1)) AND state <> 'RELEASED'
