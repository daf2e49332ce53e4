-- Marks an entry its worker holds MANUAL, for a person: one row or none.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
UPDATE samekey_compensation c JOIN (SELECT ? AS caller_ms, ? AS call_id, ? AS taker) AS p
    ON c.call_id = p.call_id
SET c.state = 'MANUAL', c.next_at = UTC_TIMESTAMP(3), c.lease_until = NULL
WHERE c.taker = p.taker
