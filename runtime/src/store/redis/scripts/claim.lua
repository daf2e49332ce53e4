-- Claims KEYS[1] (a record hash) if it has no live record. ARGV: scope, callId, lease (ms),
-- fingerprint, digest. Answers {1, fence, creation time}, or {0, the record} when the key is held.
local r = KEYS[1]
local h = redis.call('HMGET', r, 'state', 'expires_at', 'fence')
local state, exp, fence = h[1], h[2], h[3]
if (exp and exp ~= '' and not tonumber(exp)) or (fence and not tonumber(fence)) then
  return {-2, 'a stored expiry or fence is not a number'}
end
local free = (not state) or state == 'RELEASED' or (exp and exp ~= '' and tonumber(exp) <= now)
if not free then
  return {0, redis.call('HGETALL', r)}
end
-- A new record's fence is the time in microseconds' worth of ms (exact in Lua's doubles): larger than
-- any fence an earlier record of the key had, unless it was taken over a thousand times in one ms.
local f = now * 1000
if fence then f = tonumber(fence) + 1 end
f = string.format('%.0f', f)
redis.call('DEL', r)
local at = string.format('%.0f', now)
redis.call('HSET', r, 'digest', ARGV[5], 'scope', ARGV[1], 'call_id', ARGV[2], 'state', 'PROCESSING',
  'fence', f, 'lease_until', string.format('%.0f', now + tonumber(ARGV[3])), 'fingerprint', ARGV[4],
  'created', at, 'updated', at)
return {1, f, at}
