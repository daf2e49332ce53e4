-- Raises the fence floor to the fences of the rows that expired, before purge_expired.sql deletes
-- them (it deletes only rows at or under the floor): a key's new row then takes a fence above any
-- it had.
-- The parameters are named in the derived table p, in the order they are bound (MySQL's ? are
-- positional). The caller's time is not used: the server's clock judges.
UPDATE samekey_fence f JOIN (SELECT ? AS caller_ms) AS p
SET f.floor = GREATEST(f.floor, COALESCE((SELECT MAX(r.fence) FROM samekey_receipts r
    WHERE r.expires_at <= UTC_TIMESTAMP(3)), 0))
WHERE f.id = 1
