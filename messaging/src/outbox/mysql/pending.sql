-- How many messages wait.
SELECT COUNT(*) FROM samekey_outbox WHERE sent IS NULL
