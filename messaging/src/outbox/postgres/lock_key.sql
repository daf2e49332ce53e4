-- Holds the ordering key until the staging transaction ends, so that two transactions staging under
-- one key get their ids in the order they commit. $1 the ordering key.
SELECT pg_advisory_xact_lock(hashtext('samekey.outbox'), hashtext($1))
