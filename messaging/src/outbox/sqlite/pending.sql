-- How many messages wait.
SELECT count(*) FROM samekey_outbox WHERE sent IS NULL
