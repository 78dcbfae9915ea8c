# A Python worker's side of ignore_result_test.go: a task declared
# ignore_result=True, as celeriac's twin registers it.
import os

from celery import Celery

app = Celery("it_ign", broker=os.environ["IT_BROKER"], backend=os.environ["IT_BACKEND"])
app.conf.worker_hijack_root_logger = False


@app.task(name="it_ign.quiet", ignore_result=True)
def quiet(x):
    return x
