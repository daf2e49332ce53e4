-- A key's journal events that are still kept (within their keep_until, or while the key has a live
-- record), in the journal's order.
-- $1 key, $2 now (ms).
SELECT CAST(j.event AS TEXT) FROM samekey_journal j
WHERE j.key = $1
    AND (j.keep_until > $2
        OR EXISTS (SELECT 1 FROM samekey_receipts r WHERE r.key = j.key
            AND r.state <> 'RELEASED' AND (r.expires_at IS NULL OR r.expires_at > $2)))
ORDER BY j.seq
