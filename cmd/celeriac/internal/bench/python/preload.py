"""Publish N tasks with Celery's own producer, as an application would.

usage: preload.py N QUEUE TASK ARGS_JSON COUNTDOWN
ARGS_JSON "i" means args=[i] for the i-th task (tasks.noop); otherwise the
JSON list is every task's args. COUNTDOWN 0 means none.
"""
import json
import sys
import time

from benchapp import app

n, queue, task = int(sys.argv[1]), sys.argv[2], sys.argv[3]
args = None if sys.argv[4] == "i" else json.loads(sys.argv[4])
countdown = float(sys.argv[5]) or None
start = time.perf_counter()
with app.producer_or_acquire() as producer:
    for i in range(n):
        app.send_task(task, args=[i] if args is None else args, queue=queue,
                      countdown=countdown, producer=producer)
print(json.dumps({"sent": n, "seconds": time.perf_counter() - start}))
