-- Claims a key in one statement (sent in one batch with live_row.sql, its values as literals): inserts its row (the fence floor + 1 as its fence), or takes a
-- released or expired row (its fence + 1), or changes nothing when a live row holds the key. The
-- answer is in the statement's OK packet: the new fence as its last insert id (LAST_INSERT_ID(expr)),
-- 0 when nothing was taken (then the row is read). rows affected: 1 inserted, 2 taken, 1 held (the
-- driver counts found rows).
-- The assignments of ON DUPLICATE KEY UPDATE run left to right, each seeing the ones before: every
-- column whose new value depends on whether the row is taken comes before state, which is assigned
-- last but one; expires_at, last, reads the new state. VALUES(col) (not MySQL 8.0.20's row alias,
-- which MariaDB lacks) is the value the insert would have written.
-- ? key, ? scope, ? callId, ? lease (ms), ? fingerprint. The server's clock judges.
INSERT INTO samekey_receipts
    (`key`, scope, call_id, state, fence, lease_until, expires_at, fingerprint, outcome, created,
     updated)
VALUES (?, ?, ?, 'PROCESSING', LAST_INSERT_ID((SELECT f.floor FROM samekey_fence f WHERE f.id = 1) + 1),
    UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND, NULL, ?, NULL, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))
ON DUPLICATE KEY UPDATE
    fence = IF(state = 'RELEASED' OR expires_at <= UTC_TIMESTAMP(3),
        LAST_INSERT_ID(fence + 1), fence + LAST_INSERT_ID(0)),
    scope = IF(state = 'RELEASED' OR expires_at <= UTC_TIMESTAMP(3), VALUES(scope), scope),
    call_id = IF(state = 'RELEASED' OR expires_at <= UTC_TIMESTAMP(3), VALUES(call_id), call_id),
    lease_until = IF(state = 'RELEASED' OR expires_at <= UTC_TIMESTAMP(3),
        VALUES(lease_until), lease_until),
    fingerprint = IF(state = 'RELEASED' OR expires_at <= UTC_TIMESTAMP(3),
        VALUES(fingerprint), fingerprint),
    outcome = IF(state = 'RELEASED' OR expires_at <= UTC_TIMESTAMP(3), NULL, outcome),
    created = IF(state = 'RELEASED' OR expires_at <= UTC_TIMESTAMP(3), VALUES(created), created),
    updated = IF(state = 'RELEASED' OR expires_at <= UTC_TIMESTAMP(3), VALUES(updated), updated),
    state = IF(state = 'RELEASED' OR expires_at <= UTC_TIMESTAMP(3), 'PROCESSING', state),
    expires_at = IF(state = 'PROCESSING', NULL, expires_at)
