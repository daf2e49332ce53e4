-- A page of the keys that have a journal, in digest order.
-- $1 the digest to start after, $2 limit.
SELECT DISTINCT key FROM samekey_journal WHERE key > $1 ORDER BY key LIMIT $2
