-- Evicts the journal events past their keep_until whose key has no live record.
-- $1 the caller's time (unused: the server's clock judges).
DELETE FROM samekey_journal
WHERE keep_until <= samekey_ts(samekey_now($1))
    AND NOT EXISTS (SELECT 1 FROM samekey_receipts r
        WHERE r.key = samekey_journal.key AND r.state <> 'RELEASED'
            AND (r.expires_at IS NULL OR r.expires_at > samekey_ts(samekey_now($1))))
