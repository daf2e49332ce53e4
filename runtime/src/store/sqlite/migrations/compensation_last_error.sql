-- Added by a later release: how a queued call's last attempt ended.
ALTER TABLE samekey_compensation ADD COLUMN last_error TEXT
