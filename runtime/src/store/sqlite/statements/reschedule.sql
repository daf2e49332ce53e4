-- Puts an entry its worker holds back, for its next round: one row or none.
-- $1 round, $2 now (ms), $3 delay (ms), $4 callId, $5 worker fence.
UPDATE samekey_compensation
SET round = $1, next_at = $2 + $3, state = 'PENDING', lease_until = NULL
WHERE call_id = $4 AND taker = $5
