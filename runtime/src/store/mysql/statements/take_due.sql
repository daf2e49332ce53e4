-- Takes the entries due.sql locked, each under a new worker fence. In take_due's transaction.
-- ? lease (ms), ? the callIds, as a JSON array of strings. The server's clock judges.
UPDATE samekey_compensation
SET state = 'TAKEN', lease_until = UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND, taker = taker + 1
WHERE call_id IN (SELECT j.id COLLATE utf8mb4_bin
        FROM JSON_TABLE(?, '$[*]' COLUMNS (id VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) AS j)
