"""Python side of integration/amqp_transport_test.go: a Celery 5.2 app on
RabbitMQ that publishes task messages the way a Python producer does.

Configured from the environment: BROKER (the AMQP URL), QUEUE, and
MAX_PRIORITY (task_queue_max_priority; 0 or unset: none).
"""
import json
import os
import sys

from celery import Celery


def make_app():
    app = Celery("it_amqp", broker=os.environ["BROKER"])
    maxp = int(os.environ.get("MAX_PRIORITY") or 0)
    if maxp:
        # Celery declares missing queues with x-max-priority = this value.
        app.conf.task_queue_max_priority = maxp
    app.conf.broker_connection_retry_on_startup = False
    return app


def send(n, priorities=None, headers=None, prefix="t"):
    """Publishes n tasks.add messages to QUEUE with send_task and prints
    their ids, one JSON list on stdout."""
    app = make_app()
    q = os.environ["QUEUE"]
    ids = []
    with app.producer_or_acquire() as producer:
        for i in range(n):
            opts = {}
            if priorities:
                opts["priority"] = priorities[i % len(priorities)]
            if headers:
                opts["headers"] = headers
            r = app.send_task("tasks.add", args=[i, i], queue=q, task_id="%s-%d" % (prefix, i),
                              producer=producer, **opts)
            ids.append(r.id)
    app.close()
    json.dump(ids, sys.stdout)


def apply_async_add(priority):
    """Publishes one task through a registered task's apply_async."""
    app = make_app()

    @app.task(name="tasks.add")
    def add(x, y):
        return x + y

    r = add.apply_async((2, 3), queue=os.environ["QUEUE"], priority=priority, countdown=30, expires=120)
    app.close()
    json.dump([r.id], sys.stdout)


def get_headers():
    """Reads one message from QUEUE with py-amqp and prints its headers."""
    app = make_app()
    with app.connection_for_read() as conn:
        ch = conn.default_channel
        msg = ch.basic_get(os.environ["QUEUE"], no_ack=True)
        if msg is None:
            json.dump(None, sys.stdout)
        else:
            json.dump(msg.headers, sys.stdout, default=str)
    app.close()


def ping(node, control_exchange):
    """Pings a node over remote control (pidbox) and prints the replies."""
    app = make_app()
    app.conf.control_exchange = control_exchange
    replies = app.control.ping(destination=[node], timeout=10)
    app.close()
    json.dump(replies, sys.stdout)
