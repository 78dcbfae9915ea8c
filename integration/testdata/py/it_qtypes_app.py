# A Celery app configured from IT_CONF (JSON of Celery settings), for the
# queue-type tests (queue_types_test.go): Celery declares the queues -Q
# names from these settings, which celeriac must declare the same way.
import json
import os

from celery import Celery

app = Celery("it_qtypes", broker=os.environ["IT_BROKER"])
app.conf.update(json.loads(os.environ["IT_CONF"]))
app.conf.worker_hijack_root_logger = False


@app.task(name="it_qtypes.ping")
def ping():
    return "pong"
