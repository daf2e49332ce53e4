-- Puts an entry its worker holds back, for its next round: one row or none.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
UPDATE samekey_compensation c
    JOIN (SELECT ? AS round, ? AS caller_ms, ? AS delay_ms, ? AS call_id, ? AS taker) AS p
    ON c.call_id = p.call_id
SET c.round = p.round, c.next_at = UTC_TIMESTAMP(3) + INTERVAL p.delay_ms * 1000 MICROSECOND,
    c.state = 'PENDING', c.lease_until = NULL
WHERE c.taker = p.taker
