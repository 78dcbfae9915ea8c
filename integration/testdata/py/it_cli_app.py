"""Python side of celeriac's CLI integration tests (integration/cli_*_test.go).

A Celery app with real task implementations, run as a Python worker that
`celeriac inspect` / `celeriac control` talk to, and used as a client that
sends tasks to celeriac workers. The task names are those of
examples/demotasks, so one client script serves both kinds of worker.

Environment:
  IT_BROKER   broker URL (redis://.../1 or amqp://...)
  IT_BACKEND  result backend URL
  IT_QUEUE    default queue name
"""
import os
import time

from celery import Celery

app = Celery("it_cli_app", broker=os.environ["IT_BROKER"], backend=os.environ.get("IT_BACKEND"))
app.conf.update(
    task_default_queue=os.environ["IT_QUEUE"],
    accept_content=["json", "msgpack"],
    result_accept_content=["json", "msgpack"],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="tasks.add")
def add(x, y):
    return x + y


@app.task(name="tasks.mul", rate_limit="600/m")
def mul(x, y):
    return x * y


@app.task(name="tasks.sleep")
def sleep(secs):
    time.sleep(secs)
    return secs


@app.task(name="tasks.fail")
def fail(msg="tasks.fail was called"):
    raise ValueError(msg)


@app.task(name="tasks.flaky", bind=True, max_retries=5)
def flaky(self, failures):
    if self.request.retries < failures:
        raise self.retry(countdown=1, exc=ConnectionError("transient"))
    return "succeeded after %d retries" % self.request.retries


@app.task(name="tasks.tsum")
def tsum(numbers):
    return sum(numbers)


nope = app.signature("tasks.nope")
