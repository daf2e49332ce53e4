-- Updates one compensation entry. ARGV: callId, then field/value pairs. Answers 0 when the entry is
-- missing.
local s = redis.call('HGET', KEYS[1], ARGV[1])
if not s then return 0 end
local e = cjson.decode(s)
for i = 2, #ARGV, 2 do e[ARGV[i]] = ARGV[i + 1] end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(e))
return 1
