-- A page of the keys that have a journal, in digest order.
-- ? the digest to start after, ? limit.
SELECT DISTINCT `key` FROM samekey_journal WHERE `key` > ? ORDER BY `key` LIMIT ?
