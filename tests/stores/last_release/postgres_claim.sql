WITH taken AS (
    INSERT INTO samekey_receipts AS r
        (key, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome, created,
         updated)
    VALUES ($1, $2, $3, 'PROCESSING', nextval('samekey_fence'), samekey_ts(samekey_now($6) + $4),
        NULL, $5, NULL, samekey_ts(samekey_now($6)), samekey_ts(samekey_now($6)))
    ON CONFLICT (key) DO UPDATE SET
        scope = EXCLUDED.scope, call_id = EXCLUDED.call_id, state = 'PROCESSING',
        fence = nextval('samekey_fence'), lease_until = EXCLUDED.lease_until, expires_at = NULL,
        fingerprint = EXCLUDED.fingerprint, outcome = NULL, created = EXCLUDED.created,
        updated = EXCLUDED.updated, waited = false
    WHERE r.state = 'RELEASED' OR r.expires_at <= samekey_ts(samekey_now($6))
    RETURNING true AS acquired, key, scope, call_id, state, fence,
        samekey_ms(lease_until) AS lease_until, samekey_ms(expires_at) AS expires_at, fingerprint,
        outcome, samekey_ms(created) AS created, samekey_ms(updated) AS updated)
SELECT * FROM taken
UNION ALL
SELECT false AS acquired, key, scope, call_id, state, fence, samekey_ms(lease_until) AS lease_until,
    samekey_ms(expires_at) AS expires_at, fingerprint, outcome, samekey_ms(created) AS created,
    samekey_ms(updated) AS updated
FROM samekey_receipts
WHERE key = $1 AND (expires_at IS NULL OR expires_at > samekey_ts(samekey_now($6)))
    AND NOT EXISTS (SELECT 1 FROM taken)