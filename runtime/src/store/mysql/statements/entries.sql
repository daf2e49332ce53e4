-- The entries of some callIds, after take_due.sql took them. In take_due's transaction.
-- ? the callIds, as a JSON array of strings.
SELECT c.call_id, c.`key`, c.scope, c.reason, c.round,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', c.next_at) DIV 1000 AS next_at, c.state,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', c.lease_until) DIV 1000 AS lease_until,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', c.enqueued) DIV 1000 AS enqueued, c.taker, c.attempts, c.last_error, c.inputs
FROM (SELECT DISTINCT j.id FROM
        JSON_TABLE(?, '$[*]' COLUMNS (id VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) AS j) AS ids
    JOIN samekey_compensation c ON c.call_id = ids.id COLLATE utf8mb4_bin
