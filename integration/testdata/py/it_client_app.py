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
