-- Added by a later release: the attempts a call made before it was queued.
ALTER TABLE samekey_compensation ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0
