-- How many messages wait, counting at most ? (a bounded scan of the unsent rows' index).
SELECT COUNT(*) FROM (SELECT 1 FROM samekey_outbox WHERE sent IS NULL LIMIT ?) AS waiting
