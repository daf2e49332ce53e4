-- Deletes messages purgeable.sql found, by their primary keys, if still sent more than keep_ms ago:
-- a scan would lock every row it passed (under REPEATABLE READ), the heads relays hold among them,
-- and deadlock with their marks. ? keep_ms, ?ids their ids (one ? each).
DELETE FROM samekey_outbox
WHERE sent IS NOT NULL AND sent < UTC_TIMESTAMP(3) - INTERVAL ? * 1000 MICROSECOND
    AND id IN (?ids)
