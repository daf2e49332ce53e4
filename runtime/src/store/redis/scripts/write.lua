-- A fenced write of an owner, on the record KEYS[1] (and its journal, KEYS[2]). ARGV: fence, allowed states (space-separated), a relative expiry in ms
-- for the whole record ("" to keep it, "0" to persist), times to write (space-separated
-- `field:offset`, each set to the server's time plus `offset` ms), then field/value pairs to set (an
-- empty value removes the field). Answers {1}, or {0, the record} / {-1} to explain a refusal. A
-- waited-for record whose state changes is published on KEYS[1]:settled.
local r = KEYS[1]
local h = redis.call('HMGET', r, 'state', 'fence')
local state, fence = h[1], h[2]
if not state or state == 'RELEASED' then return {-1} end
if fence ~= ARGV[1] or not string.find(' ' .. ARGV[2] .. ' ', ' ' .. state .. ' ', 1, true) then
  return {0, redis.call('HGETALL', r)}
end
for i = 5, #ARGV, 2 do
  if ARGV[i + 1] == '' then redis.call('HDEL', r, ARGV[i]) else redis.call('HSET', r, ARGV[i], ARGV[i + 1]) end
end
if ARGV[4] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for field, offset in string.gmatch(ARGV[4], '(%S+):(%d+)') do
    redis.call('HSET', r, field, string.format('%.0f', now + tonumber(offset)))
  end
end
if ARGV[3] == '0' then redis.call('PERSIST', r) elseif ARGV[3] ~= '' then redis.call('PEXPIRE', r, ARGV[3]) end
-- The key's journal (KEYS[2], if it has one) lives at least as long as the record.
local j = KEYS[2]
if j and ARGV[3] ~= '' and redis.call('EXISTS', j) == 1 then
  if ARGV[3] == '0' then
    redis.call('PERSIST', j)
  elseif redis.call('PTTL', j) < tonumber(ARGV[3]) then
    redis.call('PEXPIRE', j, ARGV[3])
  end
end
local now_state = redis.call('HGET', r, 'state')
if now_state ~= state and redis.call('HEXISTS', r, 'waited') == 1 then
  redis.call('PUBLISH', r .. ':settled', now_state)
end
return {1}
