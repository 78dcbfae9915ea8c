"""Python side of celeriac's tracing tests.

Stands in for a Python fleet with opentelemetry-instrumentation-celery
(whose packages Debian does not ship): the client puts a W3C traceparent in
the message headers exactly where the instrumentation's before_task_publish
hook injects it (the `headers` of the message), and the Python task reads
it back where the instrumentation's task_prerun hook extracts it (the task
request's attributes), so a test can follow the trace across both.

Environment:
  IT_BROKER, IT_BACKEND  broker and result backend URLs
  IT_QUEUE               the queue celeriac consumes (the Go tasks)
  IT_PY_QUEUE            the queue the Python worker consumes (trace.py_look)
  IT_PROTOCOL            task_protocol (1 or 2; default 2)
"""
import os

from celery import Celery

app = Celery("it_trace_app", broker=os.environ["IT_BROKER"], backend=os.environ.get("IT_BACKEND"))
app.conf.update(
    task_default_queue=os.environ["IT_QUEUE"],
    task_protocol=int(os.environ.get("IT_PROTOCOL", "2")),
    task_routes={"trace.py_look": {"queue": os.environ["IT_PY_QUEUE"]}},
    accept_content=["json", "msgpack"],
    result_accept_content=["json", "msgpack"],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="trace.py_look", bind=True)
def py_look(self, value):
    """Runs in the Python worker: returns the trace context it received."""
    return {"value": value, "traceparent": getattr(self.request, "traceparent", None)}


def _stub(name):
    @app.task(name=name)
    def stub(*args, **kwargs):
        raise NotImplementedError(f"{name} runs in the Go worker")

    return stub


go_step = _stub("trace.go_step")
go_retry = _stub("trace.go_retry")
go_fail = _stub("trace.go_fail")
