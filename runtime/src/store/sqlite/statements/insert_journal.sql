-- Appends one journal event of a key (trim_journal.sql then trims it, in the same transaction).
-- $1 key, $2 callId, $3 time (ms), $4 now (ms), $5 how long it is kept at least (ms), $6 event (JSON).
INSERT INTO samekey_journal (key, call_id, at, keep_until, event)
VALUES ($1, $2, $3, $4 + $5, $6)
