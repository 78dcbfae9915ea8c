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
"""
import json
import os
import ssl
import sys

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


@app.task(name="flt.record", ignore_result=True)
def record(key, sleep_ms):
    raise NotImplementedError("flt.record runs in the Go worker")


def main():
    n = int(sys.argv[1])
    sleep_ms = int(os.environ["IT_SLEEP_MS"]) if os.environ.get("IT_SLEEP_MS") else None
    for i in range(n):
        # Every 25th task sleeps, so that kills and SIGTERM find tasks running.
        record.delay(f"k{i}", sleep_ms if sleep_ms is not None else (40 if i % 25 == 0 else 0))
        if (i + 1) % 500 == 0 or i + 1 == n:
            print(f"PUBLISHED {i + 1}", flush=True)
    app.pool.force_close_all()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
