INSERT INTO samekey_receipts
    (key, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome, created, updated)
VALUES (?1, ?2, ?3, 'PROCESSING', ?4, ?7 + ?5, NULL, ?6, NULL, ?7, ?7)
ON CONFLICT (key) DO UPDATE SET
    scope = excluded.scope, call_id = excluded.call_id, state = 'PROCESSING',
    fence = samekey_receipts.fence + 1, lease_until = excluded.lease_until, expires_at = NULL,
    fingerprint = excluded.fingerprint, outcome = NULL, created = excluded.created,
    updated = excluded.updated
WHERE samekey_receipts.state = 'RELEASED' OR samekey_receipts.expires_at <= ?7
RETURNING fence