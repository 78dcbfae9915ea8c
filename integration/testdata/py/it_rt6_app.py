"""Python side of celeriac's retry and dead-letter integration tests.

A Celery 5.2 app configured from the environment. The rt6.* stubs name
tasks the Go worker implements (they never run in Python); rt6.xlang has a
Python implementation too, for the cross-language retry tests.

Environment:
  IT_BROKER   broker URL (redis://.../5 or amqp://...)
  IT_BACKEND  result backend URL (redis://.../5)
  IT_QUEUE    default queue name
  IT_DLX      RabbitMQ only, optional: the queue's dead-letter exchange,
              declared as an x-dead-letter-exchange queue argument (the same
              arguments the Go worker declares, or RabbitMQ refuses the
              declaration with 406 PRECONDITION_FAILED)
"""
import os

from celery import Celery
from kombu import Exchange, Queue

app = Celery("it_rt6_app", broker=os.environ["IT_BROKER"], backend=os.environ.get("IT_BACKEND"))
queue = os.environ["IT_QUEUE"]
app.conf.update(
    task_default_queue=queue,
    accept_content=["json"],
    result_accept_content=["json"],
    broker_connection_retry_on_startup=True,
)
dlx = os.environ.get("IT_DLX")
if dlx:
    app.conf.task_queues = [
        Queue(queue, Exchange(queue), routing_key=queue, queue_arguments={"x-dead-letter-exchange": dlx}),
    ]


def _stub(name):
    @app.task(name=name)
    def stub(*args, **kwargs):
        raise NotImplementedError(f"{name} runs in the Go worker")

    return stub


flaky = _stub("rt6.flaky")
down = _stub("rt6.down")
permanent = _stub("rt6.permanent")
excluded = _stub("rt6.excluded")
throttled = _stub("rt6.throttled")
switch = _stub("rt6.switch")


@app.task(name="rt6.xlang", bind=True)
def xlang(self, go_queue=None):
    """Runs in whichever worker gets it. With go_queue, the first attempt
    retries onto the Go worker's queue (Task.retry's queue option), so the
    Go worker sees the count Python started. No expires and no custom
    headers: a Celery 5.2 retry drops custom headers and cannot retry a
    task with expires."""
    if go_queue and self.request.retries == 0:
        raise self.retry(countdown=1, queue=go_queue)
    return {"by": "python", "retries": self.request.retries}
