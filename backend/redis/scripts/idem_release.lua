-- Give the key up without a result (backend.IdempotencyStore.Release), only
-- if owner holds it: the effect did not happen and a retry may claim it.
--
-- KEYS[1]  the key
-- ARGV[1]  owner
-- Returns 1 released, 0 not held.
if redis.call('GET', KEYS[1]) == 'b' .. ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
