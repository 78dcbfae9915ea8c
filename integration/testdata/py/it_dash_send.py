"""Sends one task for the dashboard's browser test (dashboard_browser_test.go)
from a Python Celery client and prints its id.

  python it_dash_send.py '{"name": "tasks.add", "args": [2, 3], "queue": "q",
                          "countdown": 5, "dlx": "q.dlx"}'

With "canvas": "chain" it sends add(2, 3) | mul(10) | add(1), with "chord"
add(0, 1) | chord([add(1), add(2)], tsum()), all to "queue", and prints
{"id": the last task's id, "ids": every task's id, in order}.

With "count" it sends that many copies, and prints their ids one a line.

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
if spec.get("canvas"):
    from celery import chain, group
    from celery.result import GroupResult

    def sig(name, *args):
        return app.signature(name, args, queue=queue)

    if spec["canvas"] == "chain":
        c = chain(sig("tasks.add", 2, 3), sig("tasks.mul", 10), sig("tasks.add", 1))
    else:
        # A chord sent alone from a client has no common root: each
        # header task is its own (Celery gives a task sent outside a
        # task its own id as root_id). Behind a first step, as in a
        # workflow, every member has that step as root.
        c = chain(sig("tasks.add", 0, 1), group(sig("tasks.add", 1), sig("tasks.add", 2)), sig("tasks.tsum"))
    r = c.apply_async()
    ids, node = [], r
    while node is not None:
        if isinstance(node, GroupResult):
            ids.extend(reversed([m.id for m in node.results]))
        else:
            ids.append(node.id)
        node = node.parent
    ids.reverse()
    print(json.dumps({"id": r.id, "ids": ids}))
    sys.exit(0)
if spec.get("dlx"):
    queue = Queue(queue, Exchange(queue), routing_key=queue,
                  queue_arguments={"x-dead-letter-exchange": spec["dlx"]})
for _ in range(spec.get("count", 1)):
    r = app.send_task(spec["name"], args=spec.get("args", []), kwargs=spec.get("kwargs", {}),
                      queue=queue, countdown=spec.get("countdown"))
    print(r.id)
