-- Answers how many of samekey's tables the database holds (0: never a samekey store), in the
-- connection's database. No parameters.
SELECT COUNT(*) FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = 'samekey_receipts'
