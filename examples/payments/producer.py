"""Python producer for examples/payments: plain Celery code calling the
payments.charge task that a celeriac (Go) worker runs.

    export CELERY_BROKER_URL=redis://127.0.0.1:6379/0      # or amqp://guest:guest@127.0.0.1:5672//
    export CELERY_RESULT_BACKEND=redis://127.0.0.1:6379/1
    /usr/bin/python3 examples/payments/producer.py                 # the tour below
    /usr/bin/python3 examples/payments/producer.py --order o-7 --amount 1500 --no-wait
    /usr/bin/python3 examples/payments/producer.py --get TASK_ID

The tour charges a few orders, sends one order five times at once (one
charge, five identical results), and shows the two permanent failures
(declined card, invalid amount) that are never retried.
"""
import argparse
import os
import sys
import uuid

from celery import Celery

app = Celery("payments", broker=os.environ["CELERY_BROKER_URL"], backend=os.environ["CELERY_RESULT_BACKEND"])
app.conf.task_routes = {"payments.charge": {"queue": os.environ.get("PAYMENTS_QUEUE", "payments")}}


@app.task(name="payments.charge", acks_late=True)
def charge(order_id, amount, currency="eur"):
    """Declaration only: the body runs in the Go worker."""
    raise NotImplementedError("payments.charge runs in the celeriac worker")


def tour(timeout):
    run = uuid.uuid4().hex[:6]
    orders = [(f"{run}-{i}", 1000 + i) for i in range(5)]
    results = [charge.delay(order, amount) for order, amount in orders]
    for (order, _), r in zip(orders, results):
        print(f"order {order}: {r.get(timeout=timeout)}")

    dup = f"{run}-dup"
    copies = [charge.delay(dup, 4200) for _ in range(5)]
    got = [r.get(timeout=timeout) for r in copies]
    print(f"order {dup} sent 5 times: charge ids {sorted({g['charge_id'] for g in got})}")
    assert all(g == got[0] for g in got), got

    for order, amount, why in [(f"declined-{run}", 999, "declined card"), (f"{run}-bad", -5, "invalid amount")]:
        r = charge.delay(order, amount)
        try:
            r.get(timeout=timeout)
            print(f"order {order}: charged?!")
        except ValueError as exc:
            print(f"order {order} ({why}): {type(exc).__name__}: {exc}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--order", help="charge one order (default: the tour)")
    ap.add_argument("--amount", type=int, default=1500, help="amount in cents")
    ap.add_argument("--no-wait", action="store_true", help="print the task id and exit")
    ap.add_argument("--get", metavar="TASK_ID", help="wait for a task sent earlier and print its result")
    ap.add_argument("--timeout", type=float, default=120)
    a = ap.parse_args()
    if a.get:
        print(app.AsyncResult(a.get).get(timeout=a.timeout))
    elif a.order:
        r = charge.delay(a.order, a.amount)
        print(r.id)
        if not a.no_wait:
            print(r.get(timeout=a.timeout))
    else:
        tour(a.timeout)


if __name__ == "__main__":
    sys.exit(main())
