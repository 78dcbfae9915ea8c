-- Store results, as Celery's Redis backend does in _store_result + _set,
-- but atomically: skip a result whose stored state is SUCCESS (a SUCCESS is
-- never overwritten), else SETEX (or SET) the document and PUBLISH it on
-- the channel named like the key, which wakes Python clients blocked in
-- .get(). One call stores a whole group-commit batch: a script call costs
-- Redis more than the commands inside it.
--
-- KEYS[i]    result key i (celery-task-meta-<id>)
-- ARGV[1]    TTL in seconds; 0 means no TTL (SET)
-- ARGV[2]    "json" or "msgpack": how to read a stored document's status
-- ARGV[2+i]  encoded result document i
-- Returns an array: 1 where written, 0 where skipped, an error where a
-- command failed for that key (a key holding a list, out of memory): one
-- store's failure is its own, as if each had its own call.
local ttl = tonumber(ARGV[1])
local format = ARGV[2]
local find = string.find

local function succeeded(cur)
  -- A document that does not contain the bytes SUCCESS cannot be a
  -- SUCCESS; that check spares decoding it in the common STARTED -> SUCCESS
  -- case.
  if type(cur) ~= 'string' or not find(cur, 'SUCCESS', 1, true) then
    return false
  end
  local ok, doc
  if format == 'msgpack' then
    ok, doc = pcall(cmsgpack.unpack, cur)
  else
    ok, doc = pcall(cjson.decode, cur)
  end
  if ok and type(doc) == 'table' then
    return doc['status'] == 'SUCCESS'
  end
  -- Too deep or too odd for cjson, but Python writes the status first.
  return find(cur, '^{%s*"status"%s*:%s*"SUCCESS"') ~= nil
end

local function failed(r)
  return type(r) == 'table' and r.err ~= nil
end

local out = {}
for i, key in ipairs(KEYS) do
  local doc = ARGV[2 + i]
  local cur = redis.pcall('GET', key)
  if failed(cur) then
    out[i] = cur
  elseif succeeded(cur) then
    out[i] = 0
  else
    local r
    if ttl > 0 then
      r = redis.pcall('SETEX', key, ttl, doc)
    else
      r = redis.pcall('SET', key, doc)
    end
    if failed(r) then
      out[i] = r
    else
      redis.call('PUBLISH', key, doc)
      out[i] = 1
    end
  end
end
return out
