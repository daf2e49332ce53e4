-- Added by a later release: the receipts of a scope by creation time (listings of one scope). Built
-- CONCURRENTLY, outside the schema's transaction, so that claims and completions go on while it builds.
CREATE INDEX CONCURRENTLY IF NOT EXISTS samekey_receipts_scope_created
    ON samekey_receipts (scope, created, key)
