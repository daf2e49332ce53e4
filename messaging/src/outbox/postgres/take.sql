-- Takes up to $1 heads: each key's oldest unsent message, if due, locked for the batch's transaction.
-- A head another relay holds is skipped, and its key's later rows are no heads: never overtaken.
-- Only heads whose destination starts with $2 ('' for all): a key whose head goes elsewhere waits.
SELECT o.id, o.ordering_key, o.message_id, o.destination, o.headers::text AS headers, o.body,
       o.attempts
FROM samekey_outbox o
WHERE o.sent IS NULL
  AND (o.next_at IS NULL OR o.next_at <= statement_timestamp())
  AND left(o.destination, length($2)) = $2
  AND NOT EXISTS (SELECT 1 FROM samekey_outbox p
                  WHERE p.sent IS NULL AND p.ordering_key = o.ordering_key AND p.id < o.id)
ORDER BY o.id
LIMIT $1
FOR UPDATE OF o SKIP LOCKED
