-- Evicts the journal events past their keep_until whose key has no live record.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
DELETE j FROM samekey_journal j JOIN (SELECT ? AS caller_ms) AS p
WHERE j.keep_until <= UTC_TIMESTAMP(3)
    AND NOT EXISTS (SELECT 1 FROM samekey_receipts r
        WHERE r.`key` = j.`key` AND r.state <> 'RELEASED'
            AND (r.expires_at IS NULL OR r.expires_at > UTC_TIMESTAMP(3)))
