-- Answers how many of samekey's tables the database holds (0: never a samekey store), on the
-- connection's search path. No parameters.
SELECT count(*) FROM (SELECT to_regclass('samekey_receipts') AS t) AS found WHERE t IS NOT NULL
