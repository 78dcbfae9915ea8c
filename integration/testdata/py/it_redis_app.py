"""Celery app for celeriac's Redis transport interop tests (integration/redis_transport_test.go).

Configured from the environment so that every test gets its own database,
global_keyprefix, queue and visibility timeout:

  IT_REDIS_URL      broker URL (db 13)
  IT_REDIS_PREFIX   kombu global_keyprefix (isolates the test's keys, unacked included)
  IT_REDIS_QUEUE    task_default_queue
  IT_REDIS_VT       visibility_timeout in seconds
  IT_REDIS_SWEEP    when set, the worker's restore sweep runs on every 10 s
                    tick instead of every 10th (kombu 5.2 hard-codes the
                    throttle that kombu 5.6 exposes as unacked_restore_throttle)

Tasks record what they ran in the list <prefix>it_done as "<i>" items.
"""
import os
import time

import redis
from celery import Celery

URL = os.environ["IT_REDIS_URL"]
PREFIX = os.environ.get("IT_REDIS_PREFIX", "")

app = Celery("it_redis_app", broker=URL)
app.conf.update(
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("IT_REDIS_VT", "3600")),
        "global_keyprefix": PREFIX,
    },
    task_default_queue=os.environ.get("IT_REDIS_QUEUE", "celery"),
    task_ignore_result=True,
    worker_prefetch_multiplier=4,
)

if os.environ.get("IT_REDIS_SWEEP"):
    from kombu.transport import redis as kombu_redis

    _restore_visible = kombu_redis.QoS.restore_visible

    def _every_tick(self, start=0, num=10, interval=10):
        return _restore_visible(self, start=start, num=num, interval=1)

    kombu_redis.QoS.restore_visible = _every_tick

_results = redis.Redis.from_url(URL)


@app.task(name="it.record")
def record(i):
    _results.rpush(PREFIX + "it_done", str(i))


@app.task(name="it.slow", acks_late=True)
def slow(i):
    time.sleep(600)
