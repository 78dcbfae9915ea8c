"""Python side of celeriac's client integration tests (integration/client_test.go).

A Celery app with real task implementations, run as a Python worker that
the Go client (package client) sends tasks and canvases to. The celeriac
worker of the same tests registers the same names with the same
signatures, so one Go test drives both.

Environment:
  IT_BROKER   broker URL (redis://.../15 or amqp://...)
  IT_BACKEND  result backend URL (redis://.../15)
  IT_QUEUE    default queue name
"""
import os
import time

from celery import Celery

app = Celery("it_client_app", broker=os.environ["IT_BROKER"], backend=os.environ.get("IT_BACKEND"))
app.conf.update(
    task_default_queue=os.environ["IT_QUEUE"],
    accept_content=["json"],
    result_accept_content=["json"],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="tasks.add")
def add(x, y):
    return x + y


@app.task(name="tasks.mul")
def mul(x, y):
    return x * y


@app.task(name="tasks.tsum")
def tsum(xs):
    return sum(xs)


@app.task(name="tasks.fail")
def fail(msg):
    raise ValueError(msg)


@app.task(name="tasks.slow_id")
def slow_id(i, secs):
    """Returns i after secs: group members that finish out of order."""
    time.sleep(secs)
    return i


@app.task(name="tasks.area")
def area(width, height, unit="m"):
    """A task called with keyword arguments."""
    return {"area": width * height, "unit": unit + "2"}


def _flat(v):
    if isinstance(v, (list, tuple)):
        return sum(_flat(x) for x in v)
    return v


_effects = None


def _record(run, tag, value):
    """Records that canvas node tag of run ran, and how (IT_EFFECTS: a
    Redis URL): the differential canvas tester compares these between a
    Python-built and a Go-built run of one canvas."""
    global _effects
    url = os.environ.get("IT_EFFECTS")
    if not url or not run or not tag:
        return
    if _effects is None:
        import redis
        _effects = redis.Redis.from_url(url)
    key = "cd:run:" + run
    _effects.hset(key, tag, value)
    _effects.expire(key, 900)


def _queue(task):
    return ((task.request.delivery_info or {}).get("routing_key")) or "?"


@app.task(name="tasks.cd_sum", bind=True)
def cd_sum(self, *args, tag=None, run=None):
    """The differential canvas tester's task: the sum of its arguments,
    lists flattened, so any canvas shape has one deterministic result."""
    v = _flat(list(args))
    _record(run, tag, "%s@%s" % (v, _queue(self)))
    return v


@app.task(name="tasks.cd_fail", bind=True)
def cd_fail(self, *args, tag=None, run=None):
    """A failing canvas member."""
    _record(run, tag, "FAIL@%s" % _queue(self))
    raise ValueError("cd_fail %s" % tag)


@app.task(name="tasks.cd_err")
def cd_err(*args, tag=None, run=None):
    """An errback: records that it ran. Celery calls it in the failing
    task's worker (it takes *args, so it is a new-style errback) while a
    celeriac worker sends it as a task, so its queue is not recorded."""
    _record(run, tag, "ERR")
