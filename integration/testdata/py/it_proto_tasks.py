"""Celery app for integration/protocol_test.go: a real Celery 5.2 worker runs
these tasks from messages that celeriac's encoder produced.

Configured from the environment: IT_PROTO_BROKER (Redis db 12 or RabbitMQ)
and IT_PROTO_BACKEND (Redis db 12). msgpack is accepted besides JSON so
that celeriac's msgpack encoding is exercised; results are JSON.
"""
import os
import time

from celery import Celery

app = Celery('it_proto',
             broker=os.environ.get('IT_PROTO_BROKER', 'redis://127.0.0.1:6379/12'),
             backend=os.environ.get('IT_PROTO_BACKEND', 'redis://127.0.0.1:6379/12'))
app.conf.update(
    accept_content=['json', 'msgpack'],
    result_serializer='json',
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name='it_proto.add')
def add(x, y):
    return x + y


@app.task(name='it_proto.echo')
def echo(*args, **kwargs):
    return {'args': list(args), 'kwargs': kwargs}


@app.task(name='it_proto.types')
def types(*args, **kwargs):
    """Python type names of what the worker received (bytes vs str...)."""
    return {'args': [type(a).__name__ for a in args],
            'kwargs': {k: type(v).__name__ for k, v in kwargs.items()}}


@app.task(name='it_proto.request', bind=True)
def request(self, *args, **kwargs):
    """What the worker made of the message headers, and when it ran."""
    r = self.request
    custom = {k: v for k, v in vars(r).items() if k.startswith('x-')}
    return {
        'id': r.id, 'root_id': r.root_id, 'parent_id': r.parent_id,
        'group': r.group, 'retries': r.retries, 'timelimit': list(r.timelimit or []),
        'eta': r.eta, 'expires': r.expires, 'origin': r.origin,
        'custom': custom, 'ran_at': time.time(),
        'args': list(args), 'kwargs': kwargs,
    }
