-- Keeps a key's latest journal events.
-- $1 key, $2 how many.
DELETE FROM samekey_journal WHERE key = $1 AND seq <= (
    SELECT seq FROM samekey_journal WHERE key = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)
