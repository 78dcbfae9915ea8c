-- Reserve one token from a token bucket shared by every worker, refilled on
-- read: the stored state is the token count at a time, and the tokens that
-- dripped in since are added here, from Redis's own clock, so no refill job
-- is needed and every worker agrees on the time. A reservation may take the
-- bucket below zero; the caller then waits until the refill pays the debt,
-- which is what spaces the callers without anyone polling.
--
-- KEYS[1]  the bucket, a hash: t = tokens (float), at = time of t (µs)
-- ARGV[1]  refill rate, tokens per second (> 0)
-- ARGV[2]  capacity (burst), at least 1
-- ARGV[3]  "" to read the clock with TIME; else the time in µs (tests only)
-- Returns {wait µs, now µs, tokens left (string), 1 if the stored state
-- was unreadable and the bucket started again full, else 0}.
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now
if ARGV[3] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[3])
end

local state = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens, at = tonumber(state[1]), tonumber(state[2])
local reset = 0
-- Only this script writes the bucket, and it stores at <= now; state that
-- does not fit (another writer, a clock more than an hour off) starts the
-- bucket again. x ~= x is true only for NaN.
if tokens == nil or at == nil or tokens ~= tokens or at ~= at
    or math.abs(tokens) == math.huge or at > now + 3600e6 or at < 0 then
  if state[1] or state[2] then
    reset = 1
  end
  tokens, at = burst, now
end
tokens = math.min(burst, tokens)
-- A clock that went back (a failover to a host whose clock is behind)
-- refills nothing until it has caught up with the stored time.
if now > at then
  tokens = math.min(burst, tokens + (now - at) * rate / 1000000)
  at = now
end
tokens = tokens - 1

local wait = 0
if tokens < 0 then
  -- Capped (at 31 years) to stay an integer reply.
  wait = math.min(math.ceil(at - now + (-tokens) * 1000000 / rate), 1e15)
end
redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 'at', string.format('%d', at))
-- Once full again the bucket is the same as no bucket: let it go then.
local ttl = math.ceil((burst - tokens) * 1000 / rate) + 1000
if ttl > 1e12 then
  ttl = 1e12
end
redis.call('PEXPIRE', KEYS[1], string.format('%d', ttl))
return {wait, now, string.format('%.17g', tokens), reset}
