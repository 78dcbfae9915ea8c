"""A Python Celery app that really implements some of the demo tasks, so that
Python workers can share queues (and chords) with celeriac workers in mixed-
fleet tests. Configured from the same environment as it_worker_app."""
import os

from celery import Celery

app = Celery("it_worker_pyimpl", broker=os.environ["IT_BROKER"], backend=os.environ.get("IT_BACKEND"))
app.conf.update(
    task_default_queue=os.environ["IT_QUEUE"],
    accept_content=["json", "msgpack"],
    result_accept_content=["json", "msgpack"],
    result_extended=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
prefix = os.environ.get("IT_PREFIX")
if prefix:
    app.conf.broker_transport_options = {"global_keyprefix": prefix}


@app.task(name="tasks.add")
def add(x, y):
    return x + y


@app.task(name="tasks.tsum")
def tsum(numbers):
    return sum(numbers)
