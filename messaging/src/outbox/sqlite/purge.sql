-- Deletes up to $2 messages sent more than $1 ms ago.
DELETE FROM samekey_outbox WHERE id IN (
    SELECT id FROM samekey_outbox
    WHERE sent IS NOT NULL
      AND sent < strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', -$1 / 1000.0))
    LIMIT $2)
