"""Round trips: send_task, then the result, one call at a time.

usage: latency.py MODE CALLS WARMUP QUEUE
MODE get: Celery's own client, AsyncResult.get() (what an application sees).
MODE pubsub: the same send_task, but the result is awaited on a pub/sub
  subscription made (and confirmed) before the send, so that the figure is
  the worker's and the broker's share. Celery 5.2's client reads one pub/sub
  message per drain and fetches an already stored result with a GET first;
  after such fast paths, stale subscribe/unsubscribe confirmations pile up
  on its connection and a later call must drain them all, which makes its
  p99 a property of the client more than of the worker.
Prints the CALLS round-trip times in milliseconds as a JSON list. The first
warm-up call waits up to a minute for the worker to come up.
"""
import json
import os
import sys
import time
import uuid

from benchapp import app

mode, calls, warmup, queue = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
times = []
if mode == "get":
    for i in range(warmup + calls):
        start = time.perf_counter()
        app.send_task("tasks.noop", args=[i], queue=queue).get(timeout=60 if i == 0 else 10)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1000)
elif mode == "pubsub":
    import redis

    # Celery would subscribe too; this client does it itself.
    app.backend.on_task_call = lambda producer, task_id: None
    ps = redis.Redis.from_url(os.environ["BENCH_BACKEND"]).pubsub()

    def expect(kind, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = ps.get_message(timeout=max(0.0, deadline - time.monotonic()))
            if m and m["type"] == kind:
                return m
        raise TimeoutError("no %s message within %s s" % (kind, timeout))

    for i in range(warmup + calls):
        task_id = str(uuid.uuid4())
        ps.subscribe("celery-task-meta-" + task_id)
        expect("subscribe", 10)
        start = time.perf_counter()
        app.send_task("tasks.noop", args=[i], queue=queue, task_id=task_id)
        expect("message", 60 if i == 0 else 10)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1000)
        ps.unsubscribe()
        expect("unsubscribe", 10)
else:
    sys.exit("unknown mode " + mode)
print(json.dumps(times))
