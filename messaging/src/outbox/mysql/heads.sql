-- The heads a batch may take, a plain read (no lock): each key's oldest unsent message, if due,
-- oldest first. Only heads whose destination starts with the bytes of ? (bound twice; '' for all):
-- a key whose head goes elsewhere waits. Up to ?: more than the batch takes, for the heads other
-- relays hold.
SELECT h.id
FROM (SELECT MIN(o.id) AS id FROM samekey_outbox o WHERE o.sent IS NULL GROUP BY o.ordering_key)
    AS heads
    JOIN samekey_outbox h ON h.id = heads.id
WHERE (h.next_at IS NULL OR h.next_at <= UTC_TIMESTAMP(3))
    AND LEFT(h.destination, LENGTH(?)) = CAST(? AS BINARY)
ORDER BY h.id
LIMIT ?
