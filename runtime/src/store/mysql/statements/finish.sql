-- Removes an entry: whoever holds it (taker null), or only its holder (taker the worker fence).
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional).
DELETE c FROM samekey_compensation c JOIN (SELECT ? AS call_id, ? AS taker) AS p
    ON c.call_id = p.call_id
WHERE p.taker IS NULL OR c.taker = p.taker
