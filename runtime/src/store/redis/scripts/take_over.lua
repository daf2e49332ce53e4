-- Takes over KEYS[1] if it carries the expected fence and is UNKNOWN or past its lease; with ARGV[3]
-- 'finished', takes it back if it is SUCCESS or FAILED instead (a person's correction: its outcome and
-- expiry cleared). ARGV: expected fence, lease (ms), mode ('' or 'finished'). Answers
-- {1, fence, callId, creation time}, {0, the record} or {-1} (no record).
local r = KEYS[1]
local h = redis.call('HMGET', r, 'state', 'fence', 'lease_until')
local state, fence, lease = h[1], h[2], h[3]
if not state or state == 'RELEASED' then return {-1} end
if not tonumber(fence) or (lease and lease ~= '' and not tonumber(lease)) then
  return {-2, 'a stored fence or lease is not a number'}
end
local finished = ARGV[3] == 'finished'
local open
if finished then
  open = state == 'SUCCESS' or state == 'FAILED'
else
  open = state == 'UNKNOWN' or ((state == 'RECEIVED' or state == 'PROCESSING')
    and (not lease or lease == '' or tonumber(lease) <= now))
end
if fence ~= ARGV[1] or not open then
  return {0, redis.call('HGETALL', r)}
end
local f = string.format('%.0f', tonumber(fence) + 1)
if finished then
  redis.call('HDEL', r, 'outcome', 'expires_at')
  redis.call('PERSIST', r)
end
redis.call('HSET', r, 'state', 'PROCESSING', 'fence', f,
  'lease_until', string.format('%.0f', now + tonumber(ARGV[2])), 'updated', string.format('%.0f', now))
if redis.call('HEXISTS', r, 'waited') == 1 then redis.call('PUBLISH', r .. ':settled', 'PROCESSING') end
return {1, f, redis.call('HGET', r, 'call_id'), redis.call('HGET', r, 'created')}
