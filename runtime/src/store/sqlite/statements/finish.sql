-- Removes an entry: whoever holds it ($2 null), or only its holder ($2 the worker fence).
-- $1 callId, $2 worker fence or null.
DELETE FROM samekey_compensation WHERE call_id = $1 AND ($2 IS NULL OR taker = $2)
