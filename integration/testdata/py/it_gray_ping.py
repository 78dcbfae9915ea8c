"""Remote-control ping of one worker, repeated until it answers.

    it_gray_ping.py HOSTNAME      (IT_BROKER: the broker, not proxied)
Prints PONG once the worker answered; exits 1 after 110 s without one.
"""
import os
import sys
import time

from celery import Celery

app = Celery("it_gray_ping", broker=os.environ["IT_BROKER"])
host = sys.argv[1]
deadline = time.monotonic() + 110
while time.monotonic() < deadline:
    try:
        replies = app.control.ping(destination=[host], timeout=1.0)
    except Exception as exc:  # noqa: BLE001 - the broker may be busy recovering
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        time.sleep(0.5)
        continue
    if any(host in r for r in replies):
        print("PONG", flush=True)
        sys.exit(0)
print("NO PONG", flush=True)
sys.exit(1)
