-- Whether the schema is in place: every index of it (and the later indexes valid), its functions and
-- trigger, the latest column, and every time column a timestamptz (an earlier release kept BIGINT ms).
SELECT to_regclass('samekey_compensation_due') IS NOT NULL
    AND to_regclass('samekey_receipts_expires_at') IS NOT NULL
    AND to_regclass('samekey_receipts_orphans') IS NOT NULL
    AND to_regclass('samekey_receipts_created') IS NOT NULL
    AND to_regclass('samekey_receipts_scope_created') IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM pg_index WHERE NOT indisvalid AND indexrelid IN (
        to_regclass('samekey_receipts_orphans'), to_regclass('samekey_receipts_created'),
        to_regclass('samekey_receipts_scope_created')))
    AND to_regclass('samekey_journal_keep') IS NOT NULL
    AND to_regclass('samekey_fence') IS NOT NULL
    AND to_regprocedure('samekey_now(bigint)') IS NOT NULL
    AND to_regprocedure('samekey_ts(bigint)') IS NOT NULL
    AND to_regprocedure('samekey_ms(timestamptz)') IS NOT NULL
    AND EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'samekey_settled'
        AND tgrelid = to_regclass('samekey_receipts'))
    AND EXISTS (SELECT 1 FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name = 'samekey_compensation'
            AND column_name = 'inputs')
    -- The time columns, as in the conversion at the end of schema.sql.
    AND (SELECT count(*) FROM (VALUES
            ('samekey_receipts', 'lease_until'), ('samekey_receipts', 'expires_at'),
            ('samekey_receipts', 'created'), ('samekey_receipts', 'updated'),
            ('samekey_compensation', 'next_at'), ('samekey_compensation', 'lease_until'),
            ('samekey_compensation', 'enqueued'),
            ('samekey_journal', 'at'), ('samekey_journal', 'keep_until')) AS c (tbl, col)
        JOIN pg_attribute a ON a.attrelid = to_regclass(c.tbl) AND a.attname = c.col
        WHERE a.atttypid = 'timestamptz'::regtype AND NOT a.attisdropped) = 9
