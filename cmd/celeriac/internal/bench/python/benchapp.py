"""The Python side of celeriac bench: the tasks, as a Celery app.

The same app is the producer (preload.py, latency.py) and, run with
`python3 -m celery -A benchapp worker`, the Python worker being measured.
Configured from the environment by celeriac bench:
  BENCH_BROKER   broker URL
  BENCH_BACKEND  Redis result backend URL, or empty for no results
"""
import os
import time

from celery import Celery

backend = os.environ.get("BENCH_BACKEND") or None
app = Celery("benchapp", broker=os.environ["BENCH_BROKER"], backend=backend)
app.conf.update(
    task_ignore_result=backend is None,
    worker_prefetch_multiplier=4,  # Celery's default, said out loud
    task_acks_late=False,  # the default: early ack
    # The anchors measured Python without remote control; it is one more
    # consumer that celeriac keeps and Python drops, in Python's favour.
    worker_enable_remote_control=False,
    worker_send_task_events=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="tasks.noop")
def noop(*args, **kwargs):
    return None


@app.task(name="tasks.sleep")
def sleep(secs):
    time.sleep(secs)
    return secs
