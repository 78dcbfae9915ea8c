"""Python Celery worker of the gray-failure matrix (integration/gray_test.go).

flt.record does what celeriac's fault-suite worker does: count the delivery
and apply the effect once per key, atomically in Redis, so that lost tasks
and tasks that ran twice can be counted the same way for every worker.

Environment:
  IT_BROKER   broker URL (through the test's fault proxy)
  IT_QUEUE    queue (also its exchange and routing key)
  IT_EFFECTS  Redis URL of the effect store (not proxied)
  IT_PREFIX   effect key prefix
  IT_BACKEND  result backend URL (through the test's fault proxy), if any:
              flt.record then stores its result
"""
import os

import redis
from celery import Celery
from kombu import Exchange, Queue

queue = os.environ["IT_QUEUE"]
prefix = os.environ["IT_PREFIX"]
backend = os.environ.get("IT_BACKEND") or None
app = Celery("it_gray", broker=os.environ["IT_BROKER"], backend=backend)
app.conf.update(
    task_default_queue=queue,
    task_queues=[Queue(queue, Exchange(queue), routing_key=queue)],
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    worker_prefetch_multiplier=4,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,
    # The defaults otherwise: broker_heartbeat 120 s, kombu's Redis
    # health_check_interval 25 s. Only the visibility timeout is shortened,
    # to celeriac's setting in the same matrix, so that messages a dead
    # connection held come back within the run.
    broker_transport_options={"visibility_timeout": 30},
)

effects = redis.Redis.from_url(os.environ["IT_EFFECTS"])
record_script = effects.register_script("""
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
if ARGV[2] == '1' then redis.call('INCR', KEYS[4]) end
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
  redis.call('INCR', KEYS[3])
  return 1
end
return 0
""")
keys = [prefix + ":deliveries", prefix + ":effects", prefix + ":effect_count", prefix + ":redelivered"]


@app.task(name="flt.record", bind=True, ignore_result=backend is None)
def record(self, key, sleep_ms):
    redelivered = "1" if (self.request.delivery_info or {}).get("redelivered") else "0"
    return record_script(keys=keys, args=[key, redelivered]) == 1
