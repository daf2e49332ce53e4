-- Appends a key's journal events and trims its journal to leave room for them, in one statement (the
-- trim reads the rows as they were before the insert).
-- $1 key, $2 callIds, $3 times (ms), $4 events (JSON), $5 the caller's time (unused: the server's
-- clock judges), $6 how long they are kept at least (ms), $7 how many earlier events to keep.
WITH trimmed AS (
    DELETE FROM samekey_journal WHERE key = $1 AND seq <= (
        SELECT seq FROM samekey_journal WHERE key = $1 ORDER BY seq DESC LIMIT 1 OFFSET $7))
INSERT INTO samekey_journal (key, call_id, at, keep_until, event)
SELECT $1, t.c, samekey_ts(t.a), samekey_ts(samekey_now($5) + $6), t.e::jsonb
FROM unnest($2::text[], $3::bigint[], $4::text[]) WITH ORDINALITY AS t(c, a, e, n)
ORDER BY t.n
