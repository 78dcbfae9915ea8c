"""Python producer of celeriac's idempotency integration tests.

A Celery app with a stub of payments.charge, the task examples/payments
runs in Go. Each function publishes charges, waits for every result with
AsyncResult.get() and prints one JSON line per message, so that the Go test
can compare them with the fake gateway's records.

Environment:
  IT_BROKER   broker URL (redis://.../7 or amqp://...)
  IT_BACKEND  result backend URL (redis://.../7)
  IT_QUEUE    queue name (it_idem_...)
"""
import json
import os
import random

from celery import Celery

app = Celery("it_idem", broker=os.environ["IT_BROKER"], backend=os.environ["IT_BACKEND"])
app.conf.update(
    task_default_queue=os.environ["IT_QUEUE"],
    broker_connection_retry_on_startup=True,
)


@app.task(name="payments.charge", acks_late=True)
def charge(order_id, amount, currency="eur"):
    raise NotImplementedError("payments.charge runs in the Go worker")


def out(**kw):
    print(json.dumps(kw, sort_keys=True), flush=True)


def wait(order, r, timeout, copy=0):
    try:
        out(order=order, copy=copy, task_id=r.id, result=r.get(timeout=timeout))
    except Exception as exc:  # reported to the test, which fails on it
        out(order=order, copy=copy, task_id=r.id, error=f"{type(exc).__name__}: {exc}")


def charge_all(run, n, timeout):
    """Charge n distinct orders <run>-<i>; one line per order, then done."""
    sent = []
    for i in range(int(n)):
        order = f"{run}-{i}"
        sent.append((order, charge.delay(order, 100 + i)))
    out(sent=len(sent))
    for order, r in sent:
        wait(order, r, float(timeout))
    out(done=True)


def duplicates(run, orders, timeout):
    """Send each of `orders` orders 5 times: 3 copies at once, all orders
    shuffled together (so copies of one order run concurrently on several
    workers), then, once those finished, 2 more copies each."""
    names = [f"{run}-{i}" for i in range(int(orders))]
    wave = [(o, c) for o in names for c in range(3)]
    random.shuffle(wave)
    sent = [(o, c, charge.delay(o, 4200)) for o, c in wave]
    out(sent=len(sent))
    for o, c, r in sent:
        wait(o, r, float(timeout), c)
    late = [(o, c, charge.delay(o, 4200)) for o in names for c in (3, 4)]
    for o, c, r in late:
        wait(o, r, float(timeout), c)
    out(done=True)
