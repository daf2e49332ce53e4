-- Added by a later release: the receipts by creation time (listings). Built CONCURRENTLY, outside the
-- schema's transaction, so that claims and completions go on while it builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_created
    ON samekey_receipts (created, key)
