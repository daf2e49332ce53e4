-- Acts on one compensation entry of the queue KEYS[1] for the worker that holds it. ARGV: callId, the
-- worker fence ('' for whoever holds it), the action ('reschedule' with round and delay in ms,
-- 'escalate', 'finish'). Answers {1} done, {0} no such entry, {-1, taker} held by another worker.
local q = KEYS[1]
local s = redis.call('HGET', q, ARGV[1])
if not s then return {0} end
local e = cjson.decode(s)
local taker = tonumber(e.taker) or 0
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= taker then return {-1, taker} end
local action = ARGV[3]
if action == 'finish' then
  redis.call('HDEL', q, ARGV[1])
  return {1}
elseif action == 'reschedule' then
  e.round = ARGV[4]
  e.next_at = string.format('%.0f', now + tonumber(ARGV[5]))
  e.state = 'PENDING'
  e.lease_until = '0'
elseif action == 'escalate' then
  e.state = 'MANUAL'
  e.next_at = string.format('%.0f', now)
  e.lease_until = '0'
else
  return redis.error_reply('unknown compensation action ' .. tostring(action))
end
redis.call('HSET', q, ARGV[1], cjson.encode(e))
return {1}
