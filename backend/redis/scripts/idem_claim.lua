-- Claim an idempotency key (backend.IdempotencyStore.Claim), atomically.
-- The value is one string: "b" .. owner while a holder runs the effect (a
-- lease: the key's PX expiry), "d" .. result once it happened.
--
-- KEYS[1]  the key
-- ARGV[1]  owner
-- ARGV[2]  lease in milliseconds
-- Returns {0} claimed, {1, result} done, {2, ms left on the holder's lease}.
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], 'b' .. ARGV[1], 'PX', ARGV[2])
  return {0}
end
local kind = string.sub(v, 1, 1)
if kind == 'd' then
  return {1, string.sub(v, 2)}
end
if kind == 'b' then
  if string.sub(v, 2) == ARGV[1] then
    -- The same owner again (its first reply was lost): still its claim.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {0}
  end
  return {2, redis.call('PTTL', KEYS[1])}
end
return redis.error_reply('celeriac idempotency: key ' .. KEYS[1] .. ' holds a value this store did not write')
