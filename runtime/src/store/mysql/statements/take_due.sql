-- Takes the entries due.sql locked, each under a new worker fence, by their primary keys (an update
-- that scanned the table would lock, and wait on, the entries other workers locked). In take_due's
-- transaction. ? lease (ms), then ?ids the callIds (one ? each). The server's clock judges.
UPDATE samekey_compensation c
SET c.state = 'TAKEN', c.lease_until = UTC_TIMESTAMP(3) + INTERVAL ? * 1000 MICROSECOND,
    c.taker = c.taker + 1
WHERE c.call_id IN (?ids)
