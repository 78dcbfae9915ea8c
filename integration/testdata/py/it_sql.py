"""Python side of integration/sqlbackend_test.go: a Celery 5.2 app whose
result backend is Celery's SQLAlchemy DatabaseBackend on PostgreSQL
(result_backend = "db+postgresql+psycopg2://..."), with result_extended.

Configured from the environment: IT_BROKER (AMQP URL), IT_DB (the db+ URL),
IT_SCHEMA (database_table_schemas for both tables), IT_QUEUE (the default
queue, which the celeriac worker consumes). The same module is the app of
the Python worker (celery -A it_sql worker)."""
import datetime
import decimal
import fractions
import json
import os
import sys
import uuid

from celery import Celery, chain, chord, group

app = Celery("it_sql", broker=os.environ.get("IT_BROKER", "memory://"),
             backend=os.environ.get("IT_DB", "db+sqlite://"))
if os.environ.get("IT_SCHEMA"):
    app.conf.database_table_schemas = {"task": os.environ["IT_SCHEMA"], "group": os.environ["IT_SCHEMA"]}
app.conf.result_extended = True
app.conf.task_default_queue = os.environ.get("IT_QUEUE", "celery")
app.conf.broker_connection_retry_on_startup = False
app.conf.worker_hijack_root_logger = False


@app.task(name="it_sql.add")
def add(x, y):
    return x + y


@app.task(name="it_sql.tsum")
def tsum(xs):
    return sum(xs)


@app.task(name="it_sql.fail")
def fail(msg):
    raise ValueError(msg, 42)


@app.task(name="it_sql.pyvalues")
def pyvalues():
    """Values of the types Go's restricted pickle decoder reads, as a
    Python worker pickles them into the result column."""
    return {
        "int": -7, "big": 2**70, "float": 1.5, "str": "héllo ✓", "bytes": b"\x00\xff",
        "tuple": (1, "a"), "set": frozenset({3}), "none": None, "list": [True, False],
        "when": datetime.datetime(2026, 12, 2, 7, 0, 0, 123456),
        "aware": datetime.datetime(2026, 12, 2, 7, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=5, minutes=30))),
        "day": datetime.date(2024, 2, 29), "clock": datetime.time(23, 59, 1),
        "amount": decimal.Decimal("-12.50"), "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "keys": {1: "int key", None: "none key"},
    }


@app.task(name="it_sql.pyobject")
def pyobject():
    """A value of a class outside the decoder's allow-list."""
    return fractions.Fraction(1, 3)


def emit(**kw):
    print(json.dumps(kw, default=str), flush=True)


def iso(d):
    return None if d is None else [type(d).__name__, d.isoformat()]


def client(steps="get,failure,chain,group"):
    """Sends tasks the way an application does and prints what
    AsyncResult reads back from the database, one JSON line per step."""
    steps = steps.split(",")
    if "get" in steps:
        r = add.delay(2, 3)
        v = r.get(timeout=60)
        emit(step="get", value=v, state=r.state, date_done=iso(r.date_done), name=r.name,
             args=r.args, kwargs=r.kwargs, worker=r.worker, queue=r.queue, retries=r.retries,
             traceback=r.traceback)
    if "values" in steps:
        r = app.send_task("it_sql.values", args=[])
        v = r.get(timeout=60)
        emit(step="values", value=repr(v), types=sorted(type(x).__name__ for x in v.values()))
    if "failure" in steps:
        r = fail.delay("bad thing")
        exc = r.get(timeout=60, propagate=False)
        raised = None
        try:
            r.get(timeout=5)
        except Exception as e:  # what an application sees
            raised = [type(e).__name__, list(e.args)]
        emit(step="failure", state=r.state, traceback=r.traceback, result=[type(exc).__name__, list(exc.args)],
             raised=raised, date_done=iso(r.date_done))
    if "chain" in steps:
        r = chain(add.s(1, 1), add.s(10), add.s(100)).apply_async()
        emit(step="chain", value=r.get(timeout=60), parent=r.parent.get(timeout=60), state=r.state)
    if "group" in steps:
        r = group([add.s(i, i) for i in range(10)]).apply_async()
        emit(step="group", value=r.get(timeout=60), ready=r.ready(), states=sorted({x.state for x in r.results}))
    if "chordfail" in steps:
        r = chord([add.s(1, 1), fail.si("header part")])(tsum.s())
        exc = r.get(timeout=120, propagate=False)
        emit(step="chordfail", state=r.state, result=[type(exc).__name__, [str(a) for a in exc.args]])
    if "cleanup" in steps:
        r = app.send_task("celery.backend_cleanup")
        emit(step="cleanup", value=r.get(timeout=60), state=r.state)
    if "chord" in steps:
        body_queue = os.environ.get("IT_BODY_QUEUE")
        body = tsum.s().set(queue=body_queue) if body_queue else tsum.s()
        r = chord([add.s(i, i) for i in range(20)])(body)
        emit(step="chord", value=r.get(timeout=120), state=r.state, id=r.id,
             header_workers=sorted(x.worker for x in r.parent.results) if r.parent else None)
    app.close()


def many(n):
    """Sends n adds, waits for all and prints who ran each (the worker
    field of the extended result)."""
    rs = [add.delay(i, 1000) for i in range(int(n))]
    out = []
    for i, r in enumerate(rs):
        out.append([r.get(timeout=120), r.worker])
    emit(results=out)
    app.close()


def create_tables():
    """Lets Celery's backend create its tables (SessionManager.prepare_models)."""
    session = app.backend.ResultSession()
    session.close()
    emit(created=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
