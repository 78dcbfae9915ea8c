"""Celery 5.5 side of the native-delayed-delivery tests (celery55_test.go).

The queue IT_QUEUE is a quorum queue behind a topic exchange of the same
name, as a Celery 5.5 app declares it; with worker_detect_quorum_queues (the
default) the app's producer sends countdown and eta tasks through
celery_delayed_27, and its worker's DelayedDelivery bootstep declares the
levels and binds the queue. The tasks here run in the Python worker; the Go
worker registers the same names, so a result says which side ran it.

Environment: IT_BROKER (amqp://...), IT_BACKEND (redis://.../N), IT_QUEUE.
"""
import os
import time

from celery import Celery
from kombu import Exchange, Queue

QUEUE = os.environ["IT_QUEUE"]

app = Celery("it_ndd55_app", broker=os.environ["IT_BROKER"], backend=os.environ["IT_BACKEND"])
app.conf.update(
    task_default_queue=QUEUE,
    task_queues=[Queue(QUEUE, Exchange(QUEUE, type="topic"), routing_key=QUEUE,
                       queue_arguments={"x-queue-type": "quorum"})],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


def _info(task):
    req = task.request
    return {
        "at": time.time(),
        "worker": "py",
        "retries": req.retries,
        "routing_key": (req.delivery_info or {}).get("routing_key"),
        "stamps": {h: getattr(req, "stamps", {}).get(h) for h in (req.stamped_headers or [])},
    }


@app.task(name="ndd.when", bind=True)
def when(self, *args):
    """When and where it ran."""
    return _info(self)


@app.task(name="ndd.retry_once", bind=True)
def retry_once(self, *args):
    """Runs in the Go worker first (which retries it); here, it reports."""
    return _info(self)
