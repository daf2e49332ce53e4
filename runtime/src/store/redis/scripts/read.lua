-- A record as it is and the server's time, to judge its expiry by: {now, fields}. With ARGV[1] =
-- 'wait', a PROCESSING record is marked waited-for first: its next change is published on
-- KEYS[1]:settled.
if ARGV[1] == 'wait' and redis.call('HGET', KEYS[1], 'state') == 'PROCESSING' then
  redis.call('HSET', KEYS[1], 'waited', '1')
end
return {string.format('%.0f', now), redis.call('HGETALL', KEYS[1])}
