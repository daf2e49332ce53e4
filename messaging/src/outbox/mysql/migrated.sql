-- Whether the outbox's tables are in place (then migrating takes no lock): both tables, and the
-- lock table filled.
SELECT (SELECT COUNT(*) FROM information_schema.tables
        WHERE table_schema = DATABASE() AND table_name IN ('samekey_outbox', 'samekey_outbox_lock')) = 2
    AND (SELECT COUNT(*) FROM information_schema.statistics
        WHERE table_schema = DATABASE() AND table_name = 'samekey_outbox'
            AND index_name = 'samekey_outbox_unsent' AND seq_in_index = 1) = 1
