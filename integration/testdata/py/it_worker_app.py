"""Python side of celeriac's worker integration tests.

A Celery app configured from the environment, with stub declarations of the
tasks the Go worker implements: Python code calls them as it would call any
Celery task (delay, apply_async, signatures, canvas). The stubs never run in
Python; a Go worker registered under the same names runs them.

Environment:
  IT_BROKER   broker URL (redis://.../N or amqp://...)
  IT_BACKEND  result backend URL (redis://.../N or rpc://)
  IT_QUEUE    default queue name
  IT_PREFIX   kombu global_keyprefix on Redis (optional)
"""
import os
import time

from celery import Celery

app = Celery("it_worker_app", broker=os.environ["IT_BROKER"], backend=os.environ.get("IT_BACKEND"))
app.conf.update(
    task_default_queue=os.environ["IT_QUEUE"],
    task_serializer=os.environ.get("IT_SERIALIZER", "json"),
    result_serializer=os.environ.get("IT_RESULT_SERIALIZER", "json"),
    accept_content=["json", "msgpack"],
    result_accept_content=["json", "msgpack"],
    broker_connection_retry_on_startup=True,
)
prefix = os.environ.get("IT_PREFIX")
if prefix:
    app.conf.broker_transport_options = {"global_keyprefix": prefix}


def _stub(name):
    @app.task(name=name)
    def stub(*args, **kwargs):
        raise NotImplementedError(f"{name} runs in the Go worker")

    return stub


add = _stub("tasks.add")
echo = _stub("tasks.echo")
fail = _stub("tasks.fail")
sleep = _stub("tasks.sleep")
panic = _stub("tasks.panic")
tsum = _stub("tasks.tsum")
record = _stub("tasks.record")
nope = _stub("tasks.nope")


def wait_started(ids, n, timeout=20):
    """Waits until n of the tasks are STARTED (track_started) and returns
    their ids."""
    deadline = time.time() + timeout
    started = []
    while time.time() < deadline:
        started = [i for i in ids if app.AsyncResult(i).state == "STARTED"]
        if len(started) == n:
            return started
        time.sleep(0.05)
    raise AssertionError("%d of %d tasks started: %s" % (len(started), n, started))


def wait_errback_called_with(arg, timeout=20):
    """Waits for a tasks.echo errback run with [arg] as its args (Celery
    sends an errback the failed task's id) and fails if none comes."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for k in app.backend.client.keys("celery-task-meta-*"):
            m = app.backend.get_task_meta(k.decode()[len("celery-task-meta-"):])
            if m.get("status") == "SUCCESS" and isinstance(m.get("result"), dict) and m["result"].get("args") == [arg]:
                return
        time.sleep(0.2)
    raise AssertionError("no errback ran with %r" % (arg,))
