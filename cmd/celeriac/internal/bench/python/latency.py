"""Round trips: apply_async (send_task) then AsyncResult.get(), one at a time.

usage: latency.py CALLS WARMUP QUEUE
Prints the CALLS round-trip times in milliseconds as a JSON list. The first
warm-up call waits up to a minute for the worker to come up.
"""
import json
import sys
import time

from benchapp import app

calls, warmup, queue = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
times = []
for i in range(warmup + calls):
    start = time.perf_counter()
    app.send_task("tasks.noop", args=[i], queue=queue).get(timeout=60 if i == 0 else 10)
    if i >= warmup:
        times.append((time.perf_counter() - start) * 1000)
print(json.dumps(times))
