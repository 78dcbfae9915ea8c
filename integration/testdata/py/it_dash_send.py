"""Sends one task for the dashboard's browser test (dashboard_browser_test.go)
from a Python Celery client and prints its id.

  python it_dash_send.py '{"name": "tasks.add", "args": [2, 3], "queue": "q",
                          "countdown": 5, "dlx": "q.dlx"}'

With "dlx" the queue is named as a kombu Queue whose x-dead-letter-exchange
is that exchange, as a Python app declares a RabbitMQ queue with dead
lettering (the declaration must match the worker's).
"""
import json
import os
import sys

from kombu import Exchange, Queue

os.environ.setdefault("IT_QUEUE", "celery")
from it_cli_app import app  # noqa: E402

spec = json.loads(sys.argv[1])
queue = spec["queue"]
if spec.get("dlx"):
    queue = Queue(queue, Exchange(queue), routing_key=queue,
                  queue_arguments={"x-dead-letter-exchange": spec["dlx"]})
r = app.send_task(spec["name"], args=spec.get("args", []), kwargs=spec.get("kwargs", {}),
                  queue=queue, countdown=spec.get("countdown"))
print(r.id)
