-- Takes up to $1 heads under a lease of $2 ms for the batch $3, in one statement: each key's oldest
-- unsent message, if due and not leased to another batch. A leased head's key is skipped, and its
-- later rows are no heads: never overtaken. The database's clock judges ('now' is one instant for
-- the whole statement). Only heads whose destination starts with $4 ('' for all).
UPDATE samekey_outbox
SET lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', $2 / 1000.0)),
    taker = $3
WHERE id IN (
    SELECT o.id FROM samekey_outbox o
    WHERE o.sent IS NULL
      AND (o.next_at IS NULL OR o.next_at <= strftime('%Y-%m-%d %H:%M:%f', 'now'))
      AND (o.lease_until IS NULL OR o.lease_until <= strftime('%Y-%m-%d %H:%M:%f', 'now'))
      AND substr(o.destination, 1, length($4)) = $4
      AND NOT EXISTS (SELECT 1 FROM samekey_outbox p
                      WHERE p.sent IS NULL AND p.ordering_key = o.ordering_key AND p.id < o.id)
    ORDER BY o.id
    LIMIT $1)
RETURNING id, ordering_key, message_id, destination, headers, body, attempts
