-- Deletes messages the broker confirmed (keep_sent 0), by their primary keys: a scan would wait on
-- the heads other relays hold. ? their ids, a JSON array.
DELETE o FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS j
    STRAIGHT_JOIN samekey_outbox o ON o.id = j.id
