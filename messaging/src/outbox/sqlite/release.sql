-- Gives back the rows of batch $1 it did not mark ($2: their ids, a JSON array): due again at once.
UPDATE samekey_outbox SET lease_until = NULL
WHERE id IN (SELECT value FROM json_each($2)) AND taker = $1 AND sent IS NULL
