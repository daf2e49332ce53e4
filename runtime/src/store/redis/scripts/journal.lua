-- Appends ARGV[3..] (in order) to KEYS[2], the journal list of the record KEYS[1]; keeps its latest
-- ARGV[2] events, as long as the record lives (a live record without expiry: for good, until a write
-- gives the record one) and at least ARGV[1] ms from now.
local j = KEYS[2]
for i = 3, #ARGV do redis.call('RPUSH', j, ARGV[i]) end
redis.call('LTRIM', j, -tonumber(ARGV[2]), -1)
local state = redis.call('HGET', KEYS[1], 'state')
local live = state and state ~= 'RELEASED'
local left = redis.call('PTTL', KEYS[1])
if live and left == -1 then
  redis.call('PERSIST', j)
  return 1
end
local keep = math.max(tonumber(ARGV[1]), 1)
if live and left > keep then keep = left end
if redis.call('PTTL', j) < keep then redis.call('PEXPIRE', j, keep) end
return 1
