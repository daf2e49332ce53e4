-- Marks an entry its worker holds MANUAL, for a person: one row or none.
-- $1 now (ms), $2 callId, $3 worker fence.
UPDATE samekey_compensation SET state = 'MANUAL', next_at = $1, lease_until = NULL
WHERE call_id = $2 AND taker = $3
