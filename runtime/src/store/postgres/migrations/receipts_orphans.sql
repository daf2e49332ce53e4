-- Added by a later release: the records PROCESSING, by lease (the orphan sweep). Built CONCURRENTLY,
-- outside the schema's transaction, so that claims and completions go on while it builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_orphans
    ON samekey_receipts (lease_until) WHERE state = 'PROCESSING'
