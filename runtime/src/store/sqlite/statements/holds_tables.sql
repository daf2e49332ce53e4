-- Answers how many of samekey's tables the database holds (0: never a samekey store). No parameters.
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'samekey_receipts'
