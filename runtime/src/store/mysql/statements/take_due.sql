-- Takes the entries due.sql locked, each under a new worker fence, by their primary key (an update
-- that scanned the table would wait on the entries other workers locked). In take_due's transaction.
-- ? the callIds, as a JSON array of strings, ? lease (ms). The server's clock judges.
UPDATE JSON_TABLE(?, '$[*]' COLUMNS (id VARCHAR(255) CHARACTER SET utf8mb4 PATH '$')) AS j
    JOIN samekey_compensation c ON c.call_id = j.id COLLATE utf8mb4_bin
SET c.state = 'TAKEN', c.lease_until = UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND,
    c.taker = c.taker + 1
