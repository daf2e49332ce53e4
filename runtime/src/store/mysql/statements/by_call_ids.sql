-- The records some callIds hold (not released ones), in any order.
-- ? the callIds, as a JSON array of strings.
SELECT r.`key`, r.scope, r.call_id, r.state, r.fence,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.lease_until) DIV 1000 AS lease_until,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.expires_at) DIV 1000 AS expires_at,
    r.fingerprint, r.outcome,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.created) DIV 1000 AS created,
    TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', r.updated) DIV 1000 AS updated
FROM (SELECT DISTINCT j.id FROM
        JSON_TABLE(?, '$[*]' COLUMNS (id VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) AS j) AS ids
    JOIN samekey_receipts r ON r.call_id = ids.id COLLATE utf8mb4_bin
    WHERE r.state <> 'RELEASED'
