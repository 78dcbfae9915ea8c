"""Publish tasks with Python Celery: argv = task name, then "i:priority" pairs."""
import sys

from it_redis_app import app

name = sys.argv[1]
with app.producer_or_acquire() as producer:
    for spec in sys.argv[2:]:
        i, prio = spec.split(":")
        if int(i) % 2:
            app.send_task(name, args=[int(i)], priority=int(prio), producer=producer)
        else:
            app.signature(name, args=[int(i)]).apply_async(priority=int(prio), producer=producer)
print("published", len(sys.argv) - 2)
