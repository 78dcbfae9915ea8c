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
