-- Renews batch $1's lease on its rows $2 (a JSON array of ids) for $3 ms, where it still holds them
-- (its lease had not ended, or no other batch took them since): the ids it holds.
UPDATE samekey_outbox
SET lease_until = strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', $3 / 1000.0))
WHERE id IN (SELECT value FROM json_each($2)) AND taker = $1 AND sent IS NULL
RETURNING id
