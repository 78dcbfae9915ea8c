-- Move one dead-letter item back to a queue: remove it from the dead list
-- and LPUSH the envelope, atomically, so a replay never loses or doubles it.
--
-- KEYS[1] dead-letter list, KEYS[2] target list.
-- ARGV[1] the dead item exactly as stored, ARGV[2] envelope to push.
-- Returns 1 when moved, 0 when the item was gone.
--
-- Redis does not roll a script back when a command fails half way, so the
-- push must be known to succeed before the item leaves the dead list: a
-- target key of another type would make LPUSH fail after LREM and lose the
-- message.
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'list' and t ~= 'none' then
  return redis.error_reply('WRONGTYPE replay target ' .. KEYS[2] .. ' is a ' .. t .. ', not a list; the dead letter stays where it is')
end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
