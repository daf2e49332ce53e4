-- Queues the entry ARGV[2] (its JSON) under the callId ARGV[1] in the queue KEYS[1], unless one is
-- queued, due ARGV[3] ms after the server's now: the server's clock judges when entries are due, never
-- the queuing node's. Answers 1 if it was queued, 0 if one was queued already.
local q = KEYS[1]
if redis.call('HEXISTS', q, ARGV[1]) == 1 then return 0 end
local e = cjson.decode(ARGV[2])
e.next_at = string.format('%.0f', now + tonumber(ARGV[3]))
redis.call('HSET', q, ARGV[1], cjson.encode(e))
return 1
