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
-- undecodable items, ARGV[7] "1" when RPOP takes a count (Redis >= 6.2),
-- ARGV[8 .. 7+nq] queue names.
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
local rpopcount = ARGV[7] == '1'

local find, sub = string.find, string.sub

-- Python's json.dumps of a str, memoized (exchange and routing key repeat).
local pycache = {}
local function pystr(s)
  local v = pycache[s]
  if not v then
    -- cjson escapes '/', Python does not.
    v = string.gsub(cjson.encode(s), '\\/', '/')
    pycache[s] = v
  end
  return v
end

-- The patterns fast looks for, built once: kombu writes '"key": "value"'
-- (json.dumps), other producers may leave the space out.
local pats = {}
for _, name in ipairs({'delivery_tag', 'exchange', 'routing_key'}) do
  pats[name] = {'"' .. name .. '": "', '"' .. name .. '":"'}
end
local propPats = {'"properties": {', '"properties":{'}

-- props returns where the properties object starts when the key
-- "properties" occurs exactly once (kombu writes it last, so the search
-- for its fields can start there), else 1: search the whole item.
local function props(item)
  for _, pat in ipairs(propPats) do
    local s, e = find(item, pat, 1, true)
    if s then
      if find(item, '"properties"', e + 1, true) then return 1 end
      return e
    end
  end
  return 1
end

-- fast reads the string value of "name" when it occurs exactly once from
-- position from on and holds no escapes; nil otherwise (then the envelope
-- is decoded properly).
local function fast(item, name, from)
  local pp = pats[name]
  local pat = pp[1]
  local s, e = find(item, pat, from, true)
  if not s then
    pat = pp[2]
    s, e = find(item, pat, from, true)
    if not s then return nil end
  end
  if find(item, pat, e + 1, true) then return nil end
  local q = find(item, '"', e + 1, true)
  if not q then return nil end
  local v = sub(item, e + 1, q - 1)
  if find(v, '\\', 1, true) then return nil end
  return v
end

-- meta returns delivery tag, exchange and routing key (nil if absent), or
-- nil and an error.
local function meta(item)
  local from = props(item)
  local tag = fast(item, 'delivery_tag', from)
  if tag and tag ~= '' then
    local ex, rk = fast(item, 'exchange', from), fast(item, 'routing_key', from)
    if ex and rk then return tag, ex, rk end
  end
  local ok, env = pcall(cjson.decode, item)
  if not ok then return nil, 'invalid JSON' end
  if type(env) ~= 'table' or type(env['properties']) ~= 'table' then
    return nil, 'no properties'
  end
  local p = env['properties']
  tag = p['delivery_tag']
  if type(tag) ~= 'string' or tag == '' then return nil, 'no delivery_tag' end
  local ex, rk = '', nil
  local di = p['delivery_info']
  if type(di) == 'table' then
    if type(di['exchange']) == 'string' then ex = di['exchange'] end
    if type(di['routing_key']) == 'string' then rk = di['routing_key'] end
  end
  return tag, ex, rk
end

local out = {}
local hset, zadd = {}, {}
local function flush()
  if #hset > 0 then
    redis.call('HSET', KEYS[1], unpack(hset))
    redis.call('ZADD', KEYS[2], unpack(zadd))
    hset, zadd = {}, {}
  end
end

local bad = 0
local function record(qi, item)
  local qname = ARGV[7 + qi]
  local tag, ex, rk = meta(item)
  if not tag then
    bad = bad + 1
    local id = idprefix .. '-' .. bad
    redis.call('RPUSH', KEYS[2 + nq * nb + qi], cjson.encode({
      id = id, envelope = item, queue = qname, exchange = '', routing_key = '',
      reason = 'undecodable', error = 'envelope: ' .. ex, task_id = '', task_name = '',
      time = tonumber(now)}))
    out[#out + 1] = -qi; out[#out + 1] = ex; out[#out + 1] = id
    out[#out + 1] = ''; out[#out + 1] = ''
    return
  end
  if rk == nil then rk = qname end
  hset[#hset + 1] = tag
  hset[#hset + 1] = '[' .. item .. ', ' .. pystr(ex) .. ', ' .. pystr(rk) .. ']'
  zadd[#zadd + 1] = now
  zadd[#zadd + 1] = tag
  if #hset >= 1000 then flush() end
  out[#out + 1] = qi; out[#out + 1] = item; out[#out + 1] = tag
  out[#out + 1] = ex; out[#out + 1] = rk
end

local got = 0
if nq == 1 and rpopcount then
  -- One queue: no rotation, so whole bands can be popped at once.
  for b = 1, nb do
    if got >= n then break end
    local vs = redis.call('RPOP', KEYS[2 + b], n - got)
    if vs then
      for _, v in ipairs(vs) do record(1, v) end
      got = got + #vs
    end
  end
else
  local order = {}
  for i = 1, nq do order[i] = i end
  local empty = {}
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
              order[#order + 1] = q
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
    record(qi, item)
  end
end
flush()
return out
