"""Publisher of celeriac's reliability fault suite (integration/faults_test.go).

Sends N flt.record tasks with Celery's own .delay(), on the queue the Go
workers consume, printing progress so that the test can follow.

    it_flt_publish.py N
Environment:
  IT_BROKER      broker URL
  IT_QUEUE       queue (also its exchange and routing key, as Celery's default)
  IT_QUEUE_ARGS  JSON queue arguments (x-dead-letter-exchange on RabbitMQ), or empty
  IT_CA          CA bundle to verify an amqps:// or rediss:// broker with (optional)
  IT_SLEEP_MS    how long every task sleeps (default: 40 ms for every 25th, else 0)
  IT_OFFSET      first key number (default 0): keys are k<OFFSET>..k<OFFSET+N-1>
  IT_TRANSPORT_OPTIONS  JSON merged into broker_transport_options (master_name, ...)
  IT_RATE        if set, publish at most this many tasks a second (so that
                 publishing lasts through the faults of a run)
  IT_RESULTS     if set, the tasks ask for their results to be stored
                 (else ignore_result, which Celery 5 sends in the message)
  IT_RETRY       if set, a publish that raises is retried (up to 600 times,
                 0.1 s apart), as a producer that must not drop tasks would
                 do across a broker failover; retries are counted
"""
import json
import os
import ssl
import sys
import time

from celery import Celery
from kombu import Exchange, Queue

queue = os.environ["IT_QUEUE"]
qargs = json.loads(os.environ.get("IT_QUEUE_ARGS") or "{}") or None
app = Celery("it_flt", broker=os.environ["IT_BROKER"])
app.conf.update(
    task_default_queue=queue,
    task_queues=[Queue(queue, Exchange(queue), routing_key=queue, queue_arguments=qargs)],
    task_serializer="json",
    broker_connection_retry_on_startup=True,
)
ca = os.environ.get("IT_CA")
if ca and app.conf.broker_url.startswith("amqps"):
    app.conf.broker_use_ssl = {"ca_certs": ca, "cert_reqs": ssl.CERT_REQUIRED}
elif ca:
    app.conf.broker_use_ssl = {"ssl_ca_certs": ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
if app.conf.broker_url.startswith(("amqp", "pyamqp")):
    # Without publisher confirms RabbitMQ may drop what a client sent just
    # before its connection ended: the suite lost the last 200 tasks that
    # way until the publisher waited for confirms.
    app.conf.broker_transport_options = {"confirm_publish": True}
extra = json.loads(os.environ.get("IT_TRANSPORT_OPTIONS") or "{}")
if extra:
    app.conf.broker_transport_options = {**(app.conf.broker_transport_options or {}), **extra}
    app.conf.result_backend_transport_options = extra


@app.task(name="flt.record", ignore_result=not os.environ.get("IT_RESULTS"))
def record(key, sleep_ms):
    raise NotImplementedError("flt.record runs in the Go worker")


def reconnect():
    """Drop every pooled connection, so that the next publish connects
    afresh: after a Sentinel failover a kept connection to the demoted
    master answers READONLY forever, and kombu resolves the master only
    when it connects."""
    from kombu import pools
    try:
        pools.reset()
    except Exception:  # noqa: BLE001 - closing broken connections may fail
        pass
    app.amqp._producer_pool = None
    app._pool = None


def main():
    n = int(sys.argv[1])
    offset = int(os.environ.get("IT_OFFSET") or "0")
    retry = bool(os.environ.get("IT_RETRY"))
    retries = 0
    sleep_ms = int(os.environ["IT_SLEEP_MS"]) if os.environ.get("IT_SLEEP_MS") else None
    rate = float(os.environ.get("IT_RATE") or "0")
    start = None  # set once the first publish has connected
    for i in range(offset, offset + n):
        if rate and start is not None:
            ahead = start + (i - offset) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        # Every 25th task sleeps, so that kills and SIGTERM find tasks running.
        args = (f"k{i}", sleep_ms if sleep_ms is not None else (40 if i % 25 == 0 else 0))
        for attempt in range(600):
            try:
                record.delay(*args)
                break
            except Exception as exc:  # noqa: BLE001 - any broker error during a failover
                if not retry or attempt == 599:
                    raise
                retries += 1
                print(f"RETRY {args[0]}: {type(exc).__name__}: {exc}", flush=True)
                time.sleep(0.1)
                reconnect()
        if start is None:
            start = time.monotonic()
        done = i + 1 - offset
        if done % 500 == 0 or done == n:
            print(f"PUBLISHED {done}", flush=True)
    app.pool.force_close_all()
    print(f"DONE retries={retries}", flush=True)


if __name__ == "__main__":
    main()
