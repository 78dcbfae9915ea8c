-- Route a message through a direct exchange's binding set and LPUSH it to
-- every bound queue whose routing key matches (kombu's DirectExchange).
--
-- KEYS[1] binding set. ARGV[1] routing key, ARGV[2] sep, ARGV[3] payload,
-- ARGV[4] global key prefix, ARGV[5] band suffix ("" for band 0).
-- Returns the number of queues the message went to.
local members = redis.call('SMEMBERS', KEYS[1])
local sep = ARGV[2]
local seen = {}
local n = 0
for _, m in ipairs(members) do
  local i = string.find(m, sep, 1, true)
  if i then
    local rk = string.sub(m, 1, i - 1)
    local j = string.find(m, sep, i + #sep, true)
    if j and rk == ARGV[1] then
      local q = string.sub(m, j + #sep)
      if not seen[q] then
        seen[q] = true
        redis.call('LPUSH', ARGV[4] .. q .. ARGV[5], ARGV[3])
        n = n + 1
      end
    end
  end
end
return n
