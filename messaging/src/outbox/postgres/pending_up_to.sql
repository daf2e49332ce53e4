-- How many messages wait, counting at most $1 (a bounded scan of the unsent rows' index).
SELECT count(*) FROM (SELECT 1 FROM samekey_outbox WHERE sent IS NULL LIMIT $1) AS waiting
