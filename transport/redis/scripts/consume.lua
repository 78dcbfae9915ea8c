-- Pop up to ARGV[1] messages across queues and priority bands in kombu's
-- order and record each in kombu's unacked hash and index, atomically.
--
-- KEYS[1] unacked hash, KEYS[2] unacked_index zset,
-- KEYS[3 .. 2+nq*nb] band lists, queue-major: queue i band j is
--   KEYS[2 + (i-1)*nb + j] (queues in the current cycle order, bands in
--   consume order),
-- KEYS[3+nq*nb .. 2+nq*nb+nq] dead-letter list of each queue.
-- ARGV[1] max messages, ARGV[2] score (now, seconds), ARGV[3] nq, ARGV[4] nb,
-- ARGV[5] "1" to rotate queues round-robin, ARGV[6] id prefix for
-- undecodable items, ARGV[7 .. 6+nq] queue names.
--
-- Returns a flat array of 5-tuples: queue index, item, delivery tag,
-- exchange, routing key; for an item that could not be decoded (moved to
-- its queue's dead-letter list): negative queue index, error, id, "", "".
local n = tonumber(ARGV[1])
local now = ARGV[2]
local nq = tonumber(ARGV[3])
local nb = tonumber(ARGV[4])
local rotate = ARGV[5] == '1'
local idprefix = ARGV[6]

local function pystr(s)
  -- cjson escapes '/', Python's json.dumps does not.
  return (string.gsub(cjson.encode(s), '\\/', '/'))
end

local order = {}
for i = 1, nq do order[i] = i end
local empty = {}
local out = {}
local hset, zadd = {}, {}
local function flush()
  if #hset > 0 then
    redis.call('HSET', KEYS[1], unpack(hset))
    redis.call('ZADD', KEYS[2], unpack(zadd))
    hset, zadd = {}, {}
  end
end

local got, bad = 0, 0
while got < n do
  local qi, item = nil, nil
  for b = 1, nb do
    for oi = 1, nq do
      local q = order[oi]
      local ki = (q - 1) * nb + b
      if not empty[ki] then
        local v = redis.call('RPOP', KEYS[2 + ki])
        if v then
          qi, item = q, v
          if rotate then
            table.remove(order, oi)
            table.insert(order, q)
          end
          break
        end
        empty[ki] = true
      end
    end
    if item then break end
  end
  if not item then break end
  got = got + 1

  local ok, env = pcall(cjson.decode, item)
  local tag, ex, rk, err = nil, '', nil, nil
  if not ok then
    err = 'invalid JSON'
  elseif type(env) ~= 'table' or type(env['properties']) ~= 'table' then
    err = 'no properties'
  else
    local p = env['properties']
    tag = p['delivery_tag']
    if type(tag) ~= 'string' or tag == '' then
      err = 'no delivery_tag'
    else
      local di = p['delivery_info']
      if type(di) == 'table' then
        if type(di['exchange']) == 'string' then ex = di['exchange'] end
        if type(di['routing_key']) == 'string' then rk = di['routing_key'] end
      end
    end
  end
  local qname = ARGV[6 + qi]
  if err then
    bad = bad + 1
    local id = idprefix .. '-' .. bad
    local dead = cjson.encode({
      id = id, envelope = item, queue = qname, exchange = '', routing_key = '',
      reason = 'undecodable', error = 'envelope: ' .. err, task_id = '', task_name = '',
      time = tonumber(now)})
    redis.call('RPUSH', KEYS[2 + nq * nb + qi], dead)
    table.insert(out, -qi); table.insert(out, err); table.insert(out, id)
    table.insert(out, ''); table.insert(out, '')
  else
    if rk == nil then rk = qname end
    table.insert(hset, tag)
    table.insert(hset, '[' .. item .. ', ' .. pystr(ex) .. ', ' .. pystr(rk) .. ']')
    table.insert(zadd, now)
    table.insert(zadd, tag)
    if #hset >= 1000 then flush() end
    table.insert(out, qi); table.insert(out, item); table.insert(out, tag)
    table.insert(out, ex); table.insert(out, rk)
  end
end
flush()
return out
