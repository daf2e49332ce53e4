-- A key's journal events that are still kept (within their keep_until, or while the key has a live
-- record), in the journal's order.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
SELECT j.event FROM (SELECT ? AS k, ? AS caller_ms) AS p JOIN samekey_journal j ON j.`key` = p.k
WHERE j.keep_until > UTC_TIMESTAMP(3)
    OR EXISTS (SELECT 1 FROM samekey_receipts r WHERE r.`key` = j.`key`
        AND r.state <> 'RELEASED' AND (r.expires_at IS NULL OR r.expires_at > UTC_TIMESTAMP(3)))
ORDER BY j.seq
