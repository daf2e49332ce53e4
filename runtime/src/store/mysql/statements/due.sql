-- Locks the due entries (pending and due, or taken under a lease that lapsed), oldest due first;
-- entries another worker is taking meanwhile are skipped, not waited for. In take_due's transaction.
-- ? lease (ms, unused here), ? limit. The server's clock judges.
SELECT c.call_id FROM (SELECT ? AS lease_ms) AS p JOIN samekey_compensation c
WHERE (c.state = 'PENDING' AND c.next_at <= UTC_TIMESTAMP(3))
    OR (c.state = 'TAKEN' AND c.lease_until <= UTC_TIMESTAMP(3))
ORDER BY c.next_at, c.enqueued LIMIT ? FOR UPDATE SKIP LOCKED
