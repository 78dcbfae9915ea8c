-- Renew owner's lease (backend.IdempotencyStore.Extend), only if owner still
-- holds the key.
--
-- KEYS[1]  the key
-- ARGV[1]  owner
-- ARGV[2]  lease in milliseconds
-- Returns 1 renewed, 0 not held (expired, released, done or someone else's).
if redis.call('GET', KEYS[1]) == 'b' .. ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
