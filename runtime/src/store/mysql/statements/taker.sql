-- The worker fence of an entry, to tell "gone" from "taken by another worker".
-- ? callId.
SELECT taker FROM samekey_compensation WHERE call_id = ?
