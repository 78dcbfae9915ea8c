"""Tasks and app factory shared by capture.py and the Celery workers it runs.

capture.py imports this module to publish messages; it also starts real
Celery 5.2 workers with ``-A golden_tasks:worker_app`` so that result-meta
documents, RPC replies and retried messages are produced by Celery itself.
The worker's configuration comes from GOLDEN_* environment variables that
capture.py sets.
"""
import os
import time

from celery import Celery
from celery.signals import task_received

# Everything lives under these prefixes so that captures never touch queues,
# exchanges or Redis keys of other users of the shared brokers.
PREFIX = 'golden_'


# argsrepr/kwargsrepr of every request the worker received, by task id: for
# protocol 1 the worker derives them (proto1_to_proto2) on its Request, and
# the task's own context does not carry them. The pool is solo, so the task
# runs in this process and reads them back.
RECEIVED = {}


@task_received.connect
def _record_received(sender=None, request=None, **kwargs):
    RECEIVED[request.id] = {'argsrepr': request.argsrepr, 'kwargsrepr': request.kwargsrepr}


class GoldenError(Exception):
    """An exception with two args, to show exc_message as a list."""


def register(app):
    """Define the golden.* tasks on app."""

    @app.task(name='golden.add')
    def add(x, y):
        return x + y

    @app.task(name='golden.tsum')
    def tsum(nums):
        return sum(nums)

    @app.task(name='golden.echo')
    def echo(*args, **kwargs):
        return [list(args), kwargs]

    @app.task(name='golden.fail')
    def fail(msg):
        raise ValueError(msg)

    @app.task(name='golden.fail_custom')
    def fail_custom(msg, code):
        raise GoldenError(msg, code)

    @app.task(name='golden.slow', track_started=True)
    def slow(seconds):
        time.sleep(seconds)
        return seconds

    @app.task(name='golden.reqinfo', bind=True)
    def reqinfo(self, *args, **kwargs):
        # What the worker derived from the message: argsrepr/kwargsrepr (for
        # protocol 1, proto1_to_proto2 computes them), stamps, and the Python
        # type and repr of every x-* header.
        req = self.request
        headers = {k: [type(v).__name__, repr(v)]
                   for k, v in sorted((req.headers or {}).items()) if k.startswith('x-')}
        for k in dir(req):
            if k.startswith('x-'):
                v = getattr(req, k)
                headers[k] = [type(v).__name__, repr(v)]
        return {'argsrepr': req.argsrepr, 'kwargsrepr': req.kwargsrepr,
                'received': RECEIVED.pop(req.id, None),
                'stamped_headers': getattr(req, 'stamped_headers', None),
                'stamps': getattr(req, 'stamps', None), 'x_headers': headers}

    @app.task(name='golden.retry_me', bind=True, max_retries=3)
    def retry_me(self, n, out_queue):
        # The retry is routed to a queue no worker consumes, so that the
        # retried message (retries=1, parent_id=own id, ...) can be captured.
        try:
            raise KeyError('boom %s' % n)
        except KeyError as exc:
            raise self.retry(exc=exc, countdown=30, queue=out_queue)

    return app


def make_app(name='golden', broker=None, backend=None, app_cls=Celery, **conf):
    app = app_cls(name, broker=broker, backend=backend)
    app.conf.update(
        broker_connection_retry_on_startup=True,
        task_default_queue=PREFIX + 'default',
        **conf,
    )
    return register(app)


def _worker_app():
    conf = {}
    if os.environ.get('GOLDEN_EXTENDED') == '1':
        conf['result_extended'] = True
    if os.environ.get('GOLDEN_RESULT_SERIALIZER'):
        conf['result_serializer'] = os.environ['GOLDEN_RESULT_SERIALIZER']
        conf['accept_content'] = ['json', 'msgpack']
        conf['result_accept_content'] = ['json', 'msgpack']
    return make_app(
        'golden_worker',
        broker=os.environ.get('GOLDEN_BROKER', 'redis://127.0.0.1:6379/9'),
        backend=os.environ.get('GOLDEN_BACKEND', 'redis://127.0.0.1:6379/9'),
        **conf,
    )


worker_app = _worker_app()
