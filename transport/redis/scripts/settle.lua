-- Remove a delivery from kombu's unacked bookkeeping and push a payload to
-- each of the lists given, atomically: reject with requeue (LPUSH), restore
-- (RPUSH) and dead-lettering (RPUSH to the dead-letter list).
--
-- KEYS[1] unacked hash, KEYS[2] unacked_index zset, KEYS[3..] target lists.
-- ARGV[1] delivery tag, ARGV[2] "LPUSH" or "RPUSH", ARGV[3] payload,
-- ARGV[4] expected unacked value, or "" to accept any.
--
-- Returns 1 when settled, 0 when the tag was no longer unacked (acked or
-- restored elsewhere: nothing is pushed), -1 when the value differs from
-- the expected one (nothing changed).
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
if ARGV[4] ~= '' and cur ~= ARGV[4] then
  return -1
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
for i = 3, #KEYS do
  redis.call(ARGV[2], KEYS[i], ARGV[3])
end
return 1
