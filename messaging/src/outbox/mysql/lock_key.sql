-- Holds the ordering key's bucket until the staging transaction ends, so that two transactions
-- staging under one key get their ids in the order they commit. ? the ordering key.
SELECT bucket FROM samekey_outbox_lock WHERE bucket = CRC32(?) % 1000 FOR UPDATE
