-- The time the store judges leases and expiries by: the server's clock, in Unix ms.
-- $1 the caller's time (unused).
SELECT samekey_now($1)
