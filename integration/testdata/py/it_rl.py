"""Python side of integration/ratelimit_test.go: a Celery 5.2 producer that
floods queues, sets message priorities and reads results, for the queue
order, priority and rate-limit evidence.

Environment: IT_BROKER (broker URL), IT_BACKEND (result backend URL,
optional), IT_MAX_PRIORITY (task_queue_max_priority; RabbitMQ declares the
queues with x-max-priority then). Each function prints one JSON document.
"""
import json
import os
import sys
import time

from celery import Celery


def make_app():
    app = Celery("it_rl", broker=os.environ["IT_BROKER"], backend=os.environ.get("IT_BACKEND") or None)
    maxp = int(os.environ.get("IT_MAX_PRIORITY") or 0)
    if maxp:
        app.conf.task_queue_max_priority = maxp
    app.conf.broker_connection_retry_on_startup = True

    @app.task(name="it_rl.job")
    def job(label, i):
        raise NotImplementedError("runs in the Go worker")

    @app.task(name="tasks.add")
    def add(x, y):
        raise NotImplementedError("runs in the Go worker")

    return app


def backlog_then_high(low, high, n):
    """Queues n it_rl.job('low', i) on low, then one it_rl.job('high', 0) on
    high; prints the time just before the high one was published."""
    app = make_app()
    with app.producer_or_acquire() as producer:
        for i in range(n):
            app.send_task("it_rl.job", args=["low", i], queue=low, producer=producer)
        sent = time.time()
        app.send_task("it_rl.job", args=["high", 0], queue=high, producer=producer)
    app.close()
    json.dump({"high_sent": sent}, sys.stdout)


def with_priorities(queue, priorities):
    """Queues it_rl.job('p<priority>', i) with apply_async(priority=...)."""
    app = make_app()
    job = app.tasks["it_rl.job"]
    ids = []
    for i, p in enumerate(priorities):
        ids.append(job.apply_async(args=["p%d" % p, i], queue=queue, priority=p).id)
    app.close()
    json.dump(ids, sys.stdout)


def adds_and_results(queue, n, timeout):
    """Queues n tasks.add(i, i) and waits for every result; prints their
    states, results and date_done (the worker's clock, ISO 8601)."""
    app = make_app()
    add = app.tasks["tasks.add"]
    rs = [add.apply_async((i, i), queue=queue) for i in range(n)]
    out = []
    for i, r in enumerate(rs):
        value = r.get(timeout=timeout, propagate=False)
        out.append({"id": r.id, "state": r.state, "result": value,
                    "date_done": r.date_done.isoformat() if r.date_done else None})
    app.close()
    json.dump(out, sys.stdout, default=str)


def fill(queues, n):
    """Queues n it_rl.job(queue, i) on each of queues, alternating."""
    app = make_app()
    with app.producer_or_acquire() as producer:
        for i in range(n):
            for q in queues:
                app.send_task("it_rl.job", args=[q, i], queue=q, producer=producer)
    app.close()
    json.dump({"sent": n * len(queues)}, sys.stdout)


def eta_then_jobs(queue, n_eta, n):
    """Queues n_eta it_rl.job('eta', i) due in an hour, then n
    it_rl.job('now', i), on queue."""
    app = make_app()
    with app.producer_or_acquire() as producer:
        for i in range(n_eta):
            app.send_task("it_rl.job", args=["eta", i], queue=queue, countdown=3600, producer=producer)
        for i in range(n):
            app.send_task("it_rl.job", args=["now", i], queue=queue, producer=producer)
    app.close()
    json.dump({"sent": n_eta + n}, sys.stdout)
