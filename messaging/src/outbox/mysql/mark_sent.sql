-- Marks messages sent (the broker confirmed them), by their primary keys: a scan would lock, and
-- wait on, the heads other relays hold. ?ids their ids (one ? each).
UPDATE samekey_outbox SET sent = UTC_TIMESTAMP(3), next_at = NULL WHERE id IN (?ids)
