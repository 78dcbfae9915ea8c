#!/usr/bin/python3
"""Write backoff.json: retry backoff intervals computed by Celery itself.

Run with Debian's interpreter, which has python3-celery installed:

    /usr/bin/python3 retry/testdata/gen_backoff.py > retry/testdata/backoff.json

The Go test (TestBackoffIntervalMatchesCelery) compares BackoffInterval with
every row exactly. "countdown" is the value with jitter off. With jitter on
Celery's value is random, so the script swaps the module's random source for
one that records the bound Celery asks for ("jitter_bound", the n of
random.randrange(n)) and answers n-1, the largest draw; the Go test checks
that BackoffInterval asks its random source for the same bound.
"""
import json
import sys

import celery
import celery.utils.time
from celery.utils.time import get_exponential_backoff_interval

FACTORS = [1, 2, 3, 5, 10]
RETRIES = list(range(16))
MAXIMA = [600, 60, 1, 0]
# Beyond the brief's grid: factor 0 (backoff disabled by Celery's own check,
# but the function still answers), a factor above the cap, and retry counts
# where factor * 2**retries no longer fits in 64 bits (Python has big ints).
EXTRA = [
    (0, 0, 600), (0, 10, 600),
    (700, 0, 600), (700, 3, 600),
    (1, 31, 600), (1, 62, 600), (1, 63, 600), (1, 64, 600),
    (3, 61, 600), (10, 100, 600), (1, 1000, 600),
    # Large caps, still within time.Duration (about 2**33 seconds).
    (1, 32, 2**33), (1, 33, 2**33), (1, 34, 2**33), (3, 31, 2**33),
]


class TopDraw:
    """Stands in for the random module: records randrange's bound."""

    def __init__(self):
        self.bounds = []

    def randrange(self, n):
        self.bounds.append(n)
        return n - 1


def row(factor, retries, maximum):
    got = get_exponential_backoff_interval(
        factor=factor, retries=retries, maximum=maximum, full_jitter=False)
    real, fake = celery.utils.time.random, TopDraw()
    celery.utils.time.random = fake
    try:
        top = get_exponential_backoff_interval(
            factor=factor, retries=retries, maximum=maximum, full_jitter=True)
    finally:
        celery.utils.time.random = real
    assert fake.bounds == [got + 1] and top == got, (factor, retries, maximum)
    return {"factor": factor, "retries": retries, "maximum": maximum,
            "countdown": got, "jitter_bound": fake.bounds[0]}


def main():
    rows = [row(f, r, m) for m in MAXIMA for f in FACTORS for r in RETRIES]
    rows += [row(f, r, m) for f, r, m in EXTRA]
    doc = {
        "generator": "retry/testdata/gen_backoff.py",
        "celery": celery.__version__,
        "function": "celery.utils.time.get_exponential_backoff_interval",
        "full_jitter": False,
        "rows": rows,
    }
    # One row per line keeps diffs of a regenerated file readable.
    head = json.dumps({k: v for k, v in doc.items() if k != "rows"})[:-1]
    body = ",\n  ".join(json.dumps(r, sort_keys=True) for r in rows)
    sys.stdout.write(head + ', "rows": [\n  ' + body + "\n]}\n")


if __name__ == "__main__":
    main()
