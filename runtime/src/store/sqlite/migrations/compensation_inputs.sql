-- Added by a later release: a queued call's inputs, when its function keeps them.
ALTER TABLE samekey_compensation ADD COLUMN inputs BLOB
