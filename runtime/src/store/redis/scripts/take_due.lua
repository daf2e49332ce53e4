-- Takes up to ARGV[1] compensation entries of the queue KEYS[1] due now (the server's time), leasing
-- each for ARGV[2] ms under a new worker fence (`taker`). Answers the taken entries (JSON).
local q = KEYS[1]
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])
local all = redis.call('HGETALL', q)
local due = {}
for i = 1, #all, 2 do
  -- An entry that cannot be read is left where it is (listing the queue reports it), so that it
  -- does not hold up the others.
  local ok, e = pcall(cjson.decode, all[i + 1])
  if ok and type(e) == 'table' and tonumber(e.next_at) and tonumber(e.enqueued) then
    if (e.state == 'PENDING' and tonumber(e.next_at) <= now)
       or (e.state == 'TAKEN' and tonumber(e.lease_until) and tonumber(e.lease_until) <= now) then
      table.insert(due, {all[i], e})
    end
  end
end
table.sort(due, function(a, b)
  if tonumber(a[2].next_at) ~= tonumber(b[2].next_at) then
    return tonumber(a[2].next_at) < tonumber(b[2].next_at)
  end
  return tonumber(a[2].enqueued) < tonumber(b[2].enqueued)
end)
local out = {}
for i = 1, math.min(limit, #due) do
  local e = due[i][2]
  e.state = 'TAKEN'
  e.lease_until = string.format('%.0f', now + lease)
  e.taker = tostring((tonumber(e.taker) or 0) + 1)
  local s = cjson.encode(e)
  redis.call('HSET', q, due[i][1], s)
  table.insert(out, s)
end
return out
