"""Python side of integration/backend_test.go: Celery 5.2.6 as the client of
celeriac's result backends.

Every function prints one JSON line per outcome on stdout, which the Go test
parses. Configuration comes from the environment:

  IT_BACKEND            result_backend URL (redis://.../14 or rpc://)
  IT_BROKER             broker URL (default memory://)
  IT_RESULT_SERIALIZER  result_serializer (default json)
"""
import json
import os
import sys
import time

from celery import Celery
from celery.app.task import Context
from celery.canvas import chord, signature


def make_app():
    app = Celery("it_backend", broker=os.environ.get("IT_BROKER", "memory://"),
                 backend=os.environ["IT_BACKEND"])
    app.conf.result_serializer = os.environ.get("IT_RESULT_SERIALIZER", "json")
    app.conf.accept_content = ["json", "msgpack"]
    app.conf.result_accept_content = ["json", "msgpack"]
    return app


def emit(**kw):
    print(json.dumps(kw), flush=True)


def same(a, b):
    """Equality that also requires the same types (1 != 1.0 != True)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def check_values(cases_json):
    """cases: [[task_id, python expression of the expected result], ...]."""
    app = make_app()
    for task_id, expr in json.loads(cases_json):
        want = eval(expr)  # test input written in backend_test.go
        try:
            got = app.AsyncResult(task_id).get(timeout=10)
        except Exception as exc:  # reported, not raised: the test shows all cases
            emit(id=task_id, ok=False, error="%s: %s" % (type(exc).__name__, exc))
            continue
        emit(id=task_id, ok=same(got, want), got=repr(got)[:200], type=type(got).__name__)


def wait_one(task_id, timeout):
    """Block in .get() before the result exists; report how long it took."""
    app = make_app()
    res = app.AsyncResult(task_id)
    # Celery's Redis consumer reads the key once after it subscribes
    # (ResultConsumer.on_wait_for_pending); "polled" tells the test that
    # read is over, so a later write can reach .get() only through PUBLISH.
    consumer = app.backend.result_consumer
    first_read = consumer.on_wait_for_pending

    def polled(*args, **kwargs):
        first_read(*args, **kwargs)
        emit(event="polled")
    consumer.on_wait_for_pending = polled
    emit(event="waiting")
    start = time.monotonic()
    try:
        value = res.get(timeout=float(timeout))
        emit(event="done", ok=True, value=value, elapsed=time.monotonic() - start)
    except Exception as exc:
        emit(event="done", ok=False, error=type(exc).__name__, elapsed=time.monotonic() - start)


def check_meta(task_id):
    """Read the extended fields and children of a stored result."""
    app = make_app()
    app.conf.result_extended = True
    res = app.AsyncResult(task_id)
    emit(state=res.state, result=res.result, name=res.name, args=res.args, kwargs=res.kwargs,
         worker=res.worker, retries=res.retries, queue=res.queue,
         children=[c.id for c in (res.children or [])],
         date_done=res.date_done.isoformat() if res.date_done else None)


def check_exception(task_id):
    """Read a failed task as a Python client does."""
    app = make_app()
    res = app.AsyncResult(task_id)
    out = {}
    try:
        res.get(timeout=10)
        out["raised"] = None
    except Exception as exc:
        out.update(raised=type(exc).__name__, module=type(exc).__module__,
                   args=[repr(a) for a in exc.args], is_value_error=isinstance(exc, ValueError))
    # Read after .get(), which waits until the task is ready.
    out.update(state=res.state, traceback=res.traceback,
               date_done=res.date_done.isoformat() if res.date_done else None)
    emit(**out)


def chord_apply(queue, size):
    """Apply a chord through Celery's real path: the client writes .s and
    publishes the header tasks (to a queue nobody consumes)."""
    app = make_app()
    header = [signature("it_backend.add", args=(i, i), options={"queue": queue}, app=app) for i in range(int(size))]
    body = signature("it_backend.tsum", options={"queue": queue}, app=app)
    res = chord(header)(body)
    emit(group=res.parent.id, header=[r.id for r in res.parent.results], body=res.id)


def chord_wait(body_id):
    app = make_app()
    emit(value=app.AsyncResult(body_id).get(timeout=20))


def chord_set_size(group_id, size):
    make_app().backend.set_chord_size(group_id, int(size))


def chord_parts(group_id, body_queue, parts_json, turn_key):
    """Return chord parts with Celery's on_chord_part_return, each when the
    Redis counter turn_key reaches its index (the Go test takes the other
    turns). When this process completes the chord, Celery sends the body to
    body_queue; the Go test counts those messages."""
    import redis
    r = redis.Redis.from_url(os.environ["IT_BACKEND"])
    app = make_app()
    body = signature("it_backend.tsum", options={"queue": body_queue, "task_id": "body-" + group_id}, app=app)
    for index, task_id in json.loads(parts_json):
        deadline = time.monotonic() + 30
        while int(r.get(turn_key) or 0) != index:
            if time.monotonic() > deadline:
                raise SystemExit("turn %d never came" % index)
            time.sleep(0.001)
        req = Context(id=task_id, group=group_id, group_index=index, chord=dict(body))
        app.backend.store_result(task_id, index * 10, "SUCCESS", request=req)
        app.backend.on_chord_part_return(req, "SUCCESS", index * 10)
        r.incr(turn_key)
    emit(done=True)


def chord_parts_race(chords_json, body_queue, start_key):
    """Return the given parts of many chords as fast as possible, racing the
    Go test that returns the other parts concurrently. Both start when the
    Go test sets start_key."""
    import redis
    r = redis.Redis.from_url(os.environ["IT_BACKEND"])
    app = make_app()
    app.backend.client.ping()
    emit(event="ready")
    deadline = time.monotonic() + 30
    while not r.get(start_key):
        if time.monotonic() > deadline:
            raise SystemExit("never started")
        time.sleep(0.0005)
    for group_id, index, task_id in json.loads(chords_json):
        body = signature("it_backend.tsum", args=(), options={"queue": body_queue, "task_id": "body-" + group_id}, app=app)
        req = Context(id=task_id, group=group_id, group_index=index, chord=dict(body))
        app.backend.on_chord_part_return(req, "SUCCESS", index * 10)
    emit(done=True)


def rpc_send(queue, args_json, wait_timeout):
    """Send a task with the rpc:// backend to a queue nobody consumes and wait
    for its result."""
    app = make_app()
    res = app.send_task("it_backend.add", args=json.loads(args_json), queue=queue)
    emit(event="sent", id=res.id)
    try:
        emit(event="done", ok=True, value=res.get(timeout=float(wait_timeout)))
    except Exception as exc:
        emit(event="done", ok=False, raised=type(exc).__name__, args=[repr(a) for a in exc.args],
             state=res.state)


if __name__ == "__main__":
    fn = globals()[sys.argv[1]]
    fn(*sys.argv[2:])
