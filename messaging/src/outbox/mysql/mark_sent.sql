-- Marks messages sent (the broker confirmed them), by their primary keys: a scan would wait on the
-- heads other relays hold. ? their ids, a JSON array.
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS j
    STRAIGHT_JOIN samekey_outbox o ON o.id = j.id
SET o.sent = UTC_TIMESTAMP(3), o.next_at = NULL
