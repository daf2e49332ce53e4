-- Appends one journal event of a key (trim_journal.sql then trims it, in the same transaction).
-- ? key, ? callId, ? time (ms), ? how long it is kept at least (ms), ? event (JSON). The server's
-- clock judges the keep.
INSERT INTO samekey_journal (`key`, call_id, at, keep_until, event)
VALUES (?, ?, TIMESTAMP '1970-01-01 00:00:00' + INTERVAL ? * 1000 MICROSECOND, UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND, ?)
