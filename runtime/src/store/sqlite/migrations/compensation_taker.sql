-- Added by a later release: the worker fence of an entry's latest take.
ALTER TABLE samekey_compensation ADD COLUMN taker INTEGER NOT NULL DEFAULT 0
