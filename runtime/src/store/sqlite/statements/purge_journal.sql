-- Evicts the journal events past their keep_until whose key has no live record.
-- $1 now (ms).
DELETE FROM samekey_journal
WHERE keep_until <= $1
    AND NOT EXISTS (SELECT 1 FROM samekey_receipts r
        WHERE r.key = samekey_journal.key AND r.state <> 'RELEASED'
            AND (r.expires_at IS NULL OR r.expires_at > $1))
