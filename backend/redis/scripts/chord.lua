-- One chord part returns: Celery's on_chord_part_return (celery/backends/
-- redis.py, 5.2) in one atomic step. Python runs the first half as MULTI/EXEC
-- and the ZRANGE and DEL afterwards; a script is serialised against those
-- transactions, so exactly one caller, Go or Python, sees the count reach the
-- chord size.
--
-- KEYS[1]  <gid>.j  sorted set (or list in unordered mode) of parts
-- KEYS[2]  <gid>.t  extra parts added by Task.replace (INCR), may be absent
-- KEYS[3]  <gid>.s  chord size, set by the client before the last part
-- KEYS[4]  <group prefix><gid>: exists when the client saved a complex header
-- ARGV[1]  member: the encoded [1, task_id, state, result]
-- ARGV[2]  score: group_index, or "+inf" when it has none
-- ARGV[3]  TTL in seconds; 0 means none
-- ARGV[4]  "1" for list mode (result_chord_ordered = False)
-- Returns {0, count} while incomplete, or
-- {1, count, complex(0|1), members, scores} for the completing part (scores
-- empty in list mode).
local list = ARGV[4] == '1'
local count
if list then
  redis.call('RPUSH', KEYS[1], ARGV[1])
  count = redis.call('LLEN', KEYS[1])
else
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  count = redis.call('ZCOUNT', KEYS[1], '-inf', '+inf')
end
local t = redis.call('GET', KEYS[2])
local s = redis.call('GET', KEYS[3])
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
  redis.call('EXPIRE', KEYS[3], ttl)
end
if not s then
  return {0, count}
end
local size = tonumber(s)
if not size then
  return redis.error_reply('ERR chord size key ' .. KEYS[3] .. ' is not a number')
end
local total = size + (tonumber(t) or 0)
if count ~= total then
  return {0, count}
end
local complex = redis.call('EXISTS', KEYS[4])
local members, scores = {}, {}
if list then
  members = redis.call('LRANGE', KEYS[1], 0, total)
else
  local flat = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #flat, 2 do
    members[#members + 1] = flat[i]
    scores[#scores + 1] = flat[i + 1]
  end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return {1, count, complex, members, scores}
