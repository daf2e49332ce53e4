-- The time the store judges leases and expiries by: the server's clock, in Unix ms.
-- ? the caller's time (unused).
SELECT TIMESTAMPDIFF(MICROSECOND, TIMESTAMP '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000 FROM (SELECT ? AS caller_ms) AS p
