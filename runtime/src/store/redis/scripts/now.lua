-- The server's time in ms: every script that judges or writes a time reads it here, never from a caller.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
