-- The worker fence of an entry, to tell "gone" from "taken by another worker".
-- $1 callId.
SELECT taker FROM samekey_compensation WHERE call_id = $1
