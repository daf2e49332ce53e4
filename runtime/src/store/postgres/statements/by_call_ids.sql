-- The records some callIds hold (not released ones), in any order.
-- $1 the callIds, as a JSON array of strings.
SELECT key, scope, call_id, state, fence, samekey_ms(lease_until) AS lease_until,
    samekey_ms(expires_at) AS expires_at, fingerprint, outcome, samekey_ms(created) AS created,
    samekey_ms(updated) AS updated
FROM samekey_receipts
WHERE call_id IN (SELECT jsonb_array_elements_text(CAST($1 AS jsonb))) AND state <> 'RELEASED'
