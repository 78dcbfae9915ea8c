"""Imported at startup by every Python process of the CELERIAC_CELERY=5.5
tests (pyEnv puts this directory on PYTHONPATH for 5.5 only).

Celery 5.5.2's Redis result backend can hang a client for good: when the
cyclic garbage collector finalizes an AsyncResult while the same thread is
inside a pub/sub call (a .get() subscribing, a send_task), the finalizer
unsubscribes and waits for redis-py's PubSub lock, which that thread holds
(celery/celery#10477, fixed after 5.5.2). It is a Python client bug, not a
wire difference; the test processes are short-lived, so they run with the
cyclic collector off and finalizers run only when a reference is dropped,
never in the middle of a subscribe.
"""
import gc

gc.disable()
