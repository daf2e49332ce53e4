-- Claims a key: takes it (a new row, or a released or expired one) and answers its fence, or changes
-- nothing and answers no row (the key is held: its row is read next).
-- ?1 key, ?2 scope, ?3 callId, ?4 the fence of a new row, ?5 lease (ms), ?6 fingerprint, ?7 now (ms).
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
