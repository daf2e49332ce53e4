-- Deletes KEYS[1] if it expired by the server's clock. Answers 1 if it did.
local exp = redis.call('HGET', KEYS[1], 'expires_at')
if exp and exp ~= '' and tonumber(exp) <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
