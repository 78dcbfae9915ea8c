"""The Python side of examples/pyinterop: plain Celery code, unchanged, calling
tasks that a celeriac (Go) worker runs.

    export CELERY_BROKER_URL=redis://localhost:6379/0
    export CELERY_RESULT_BACKEND=redis://localhost:6379/1
    /usr/bin/python3 examples/pyinterop/client.py
"""
import os

from celery import Celery, chain, chord, group

app = Celery("client", broker=os.environ["CELERY_BROKER_URL"], backend=os.environ["CELERY_RESULT_BACKEND"])
# The queue the Go worker consumes (its CELERY_QUEUE; Celery's default is celery).
app.conf.task_default_queue = os.environ.get("CELERY_QUEUE", "celery")


# Declarations only: the bodies run in Go. (send_task("tasks.add", ...) works too.)
@app.task(name="tasks.add")
def add(x, y): ...


@app.task(name="tasks.tsum")
def tsum(numbers): ...


@app.task(name="tasks.wordcount")
def wordcount(text): ...


@app.task(name="tasks.fail")
def fail(message): ...


if __name__ == "__main__":
    print("add(2, 3) =", add.delay(2, 3).get(timeout=10))
    print("wordcount =", wordcount.delay("the quick brown fox jumps over the lazy dog the end").get(timeout=10))
    print("chain =", chain(add.s(1, 2), add.s(3), add.s(4))().get(timeout=10))
    print("group =", group(add.s(i, i) for i in range(5))().get(timeout=10))
    print("chord =", chord([add.s(i, i) for i in range(10)], tsum.s())().get(timeout=10))
    try:
        fail.delay("bad input").get(timeout=10)
    except ValueError as exc:
        print("fail raised ValueError:", exc)
    print("workers:", app.control.ping(timeout=1))
