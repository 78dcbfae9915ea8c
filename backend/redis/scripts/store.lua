-- Store one result, as Celery's Redis backend does in _store_result + _set,
-- but atomically: skip when the stored state is SUCCESS (a SUCCESS is never
-- overwritten), else SETEX (or SET) the document and PUBLISH it on the
-- channel named like the key, which wakes Python clients blocked in .get().
--
-- KEYS[1]  result key (celery-task-meta-<id>)
-- ARGV[1]  encoded result document
-- ARGV[2]  TTL in seconds; 0 means no TTL (SET)
-- ARGV[3]  "json" or "msgpack": how to read the stored document's status
-- Returns 1 when written, 0 when skipped.
local cur = redis.call('GET', KEYS[1])
-- A document that does not contain the bytes SUCCESS cannot be a SUCCESS;
-- that check spares decoding it in the common STARTED -> SUCCESS case.
if cur and string.find(cur, 'SUCCESS', 1, true) then
  local ok, doc
  if ARGV[3] == 'msgpack' then
    ok, doc = pcall(cmsgpack.unpack, cur)
  else
    ok, doc = pcall(cjson.decode, cur)
  end
  local status
  if ok and type(doc) == 'table' then
    status = doc['status']
  elseif string.find(cur, '^{%s*"status"%s*:%s*"SUCCESS"') then
    -- Too deep or too odd for cjson, but Python writes the status first.
    status = 'SUCCESS'
  end
  if status == 'SUCCESS' then
    return 0
  end
end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('SETEX', KEYS[1], ttl, ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
