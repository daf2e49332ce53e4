-- Deletes messages the broker confirmed (keep_sent 0), by their primary keys: a scan would lock,
-- and wait on, the heads other relays hold. ?ids their ids (one ? each).
DELETE FROM samekey_outbox WHERE id IN (?ids)
