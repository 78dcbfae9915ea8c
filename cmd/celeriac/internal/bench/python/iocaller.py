"""celeriac bench io's Python caller: open-loop arrivals, each published
with send_task and awaited with AsyncResult.get(), as a Python application
calls .delay().get().

usage: iocaller.py URL_PREFIX FIRST N RATE SEED THREADS

The tasks are benchio's bench.io, numbered FIRST to FIRST+N-1 on the
benchmark's server (URL_PREFIX is its URL up to the run). Arrivals are
Poisson at RATE a second. Each is handed to one of THREADS threads, which
publishes it and blocks in get(): Celery keeps a result backend per thread,
so each thread has its own Redis connection and pub/sub subscription, as a
threaded web server's requests would. Prints "ready" once every thread has
connected its backend, starts the schedule when a line arrives on stdin,
and prints a JSON object at the end: took (ms from just before send_task
to get()'s return, per task), failed, errors (the first few), late_ms (how
long the latest arrival waited for a free thread or the schedule).
"""
import json
import queue
import random
import sys
import threading
import time

from benchio import app

prefix, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rate, seed, nthreads = float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])

work = queue.Queue()
lock = threading.Lock()
took, errors, late = [], [], [0.0]
ready = threading.Barrier(nthreads + 1)


def caller():
    app.backend.client.ping()  # this thread's own backend, connected before the clock starts
    ready.wait()
    while True:
        item = work.get()
        if item is None:
            return
        i, due = item
        start = time.perf_counter()
        url = "%s&i=%d&p=%d" % (prefix, i, time.time_ns())
        try:
            app.send_task("bench.io", args=[url], queue="bench_io").get(timeout=600)
        except Exception as e:  # reported, not raised: one failure must not hide the rest
            with lock:
                errors.append(repr(e))
            continue
        end = time.perf_counter()
        with lock:
            took.append((end - start) * 1000)
            late[0] = max(late[0], start - due)


threads = [threading.Thread(target=caller, daemon=True) for _ in range(nthreads)]
for t in threads:
    t.start()
ready.wait()
print("ready", flush=True)
sys.stdin.readline()

rng = random.Random(seed)
due = time.perf_counter()
for j in range(n):
    due += rng.expovariate(rate)
    d = due - time.perf_counter()
    if d > 0:
        time.sleep(d)
    work.put((first + j, due))
for _ in threads:
    work.put(None)
for t in threads:
    t.join()
print(json.dumps({"took": took, "failed": len(errors), "errors": errors[:3], "late_ms": late[0] * 1000}), flush=True)
