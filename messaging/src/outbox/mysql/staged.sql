-- Whether a message with this id is staged: a plain read, before the insert, so that a stage seen
-- to be a duplicate takes no lock (the insert's duplicate-key check holds a shared lock on the id
-- until the caller's transaction ends, which a relay deleting the sent row would wait for).
-- ? message id.
SELECT COUNT(*) FROM samekey_outbox WHERE message_id = ?
