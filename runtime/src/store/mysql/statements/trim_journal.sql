-- Keeps a key's latest journal events (the derived table x lets MySQL read the table it deletes from).
-- ? key, ? key again, ? how many.
DELETE FROM samekey_journal WHERE `key` = ? AND seq <= (
    SELECT x.seq FROM (SELECT seq FROM samekey_journal WHERE `key` = ?
        ORDER BY seq DESC LIMIT 1 OFFSET ?) AS x)
