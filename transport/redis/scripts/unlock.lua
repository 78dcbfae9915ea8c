-- Release a mutex only if it still holds our token (redis-py's Lock.release).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
