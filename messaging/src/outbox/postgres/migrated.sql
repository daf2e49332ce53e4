-- Whether the outbox's table and indexes are in place (then migrating takes no lock).
SELECT to_regclass('samekey_outbox') IS NOT NULL
    AND to_regclass('samekey_outbox_unsent') IS NOT NULL
    AND to_regclass('samekey_outbox_queue') IS NOT NULL
    AND to_regclass('samekey_outbox_sent') IS NOT NULL
