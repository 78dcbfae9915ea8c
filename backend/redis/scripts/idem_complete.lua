-- Record the result (backend.IdempotencyStore.Complete). The effect
-- happened, so the result is recorded even when owner's lease lapsed or
-- another delivery has claimed the key since; only a result recorded first
-- is kept, so every duplicate sees the original one.
--
-- KEYS[1]  the key
-- ARGV[1]  owner
-- ARGV[2]  result
-- ARGV[3]  how long to keep it, in milliseconds
-- Returns 1 recorded, 0 a result was already there (kept).
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) == 'd' then
  return 0
end
redis.call('SET', KEYS[1], 'd' .. ARGV[2], 'PX', ARGV[3])
return 1
