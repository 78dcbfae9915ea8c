#!/usr/bin/python3
"""Capture golden Celery wire data for celeriac's protocol tests.

Run with Debian 12's python3-celery 5.2.6 / kombu 5.2.4, and again with
Debian 13's 5.5.2 / kombu 5.5.3 first on PYTHONPATH (see README.md):

    /usr/bin/python3 protocol/testdata/capture/capture.py
    PYTHONPATH=$HOME/.cache/celeriac/celery-5.5/root/usr/lib/python3/dist-packages \
        /usr/bin/python3 protocol/testdata/capture/capture.py

5.2 writes protocol/testdata/golden/, 5.5 protocol/testdata/golden/celery55/,
with the scenarios only 5.5 has (typed JSON, stamping, native delayed
delivery) added.

It publishes task messages through real brokers with real Celery and writes,
for every scenario, the raw Redis list item (LRANGE, exact bytes) and the
AMQP parts (py-amqp basic_get) to protocol/testdata/golden/. It then runs
real Celery 5.2 workers (--pool=solo) to capture result-meta documents, RPC
replies and messages that only a worker produces (a retried task, the next
step of a chain).

Only Redis db 9 (flushed before and after) and RabbitMQ queues/exchanges
named golden_* are touched; they are deleted at the end.

Determinism: before Celery and kombu are imported, uuid.uuid4 is replaced
by a counter (ids look like 0000000N-0000-4000-8000-00000000000M, N = the
scenario number), and the publishing apps use a fixed clock (app.now()
returns FIXED_NOW), so that regenerating yields the same ids, delivery tags
and eta/expires values. Only origin and reply_to (derived from pid and host)
change between runs; captures.json records them. Worker-produced data uses
the real clock.
"""
import uuid as _uuid_module


class _CounterUUID:
    """uuid4 replacement: UUID4-shaped ids from a (namespace, counter) pair."""

    def __init__(self):
        self.ns = 0
        self.n = 0

    def reset(self, ns):
        self.ns, self.n = ns, 0

    def __call__(self):
        self.n += 1
        return _uuid_module.UUID(int=(self.ns << 96) | self.n, version=4)


IDS = _CounterUUID()
_uuid_module.uuid4 = IDS  # must happen before kombu binds uuid4 at import

import base64  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from datetime import date, datetime, timedelta, timezone  # noqa: E402
from decimal import Decimal  # noqa: E402
from zoneinfo import ZoneInfo  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # keep __pycache__ out of testdata
sys.path.insert(0, HERE)

import amqp  # noqa: E402
import celery  # noqa: E402
import kombu  # noqa: E402
import redis  # noqa: E402
from celery import Celery, chain, chord, group  # noqa: E402
from celery.utils.nodenames import anon_nodename  # noqa: E402
from kombu import Exchange, Queue  # noqa: E402

import golden_tasks  # noqa: E402

# V55: the scenarios 5.5 added (typed JSON, stamping, native delayed
# delivery) are captured from 5.5 and from 5.6 alike.
MINOR = '.'.join(celery.__version__.split('.')[:2])
if MINOR not in ('5.2', '5.5', '5.6'):
    sys.exit('capture.py: celery %s is not 5.2, 5.5 or 5.6' % celery.__version__)
V55 = MINOR != '5.2'
OUT = os.path.normpath(os.path.join(HERE, '..', 'golden',
                                    *({'5.5': ['celery55'], '5.6': ['celery56']}.get(MINOR, []))))
REDIS_URL = os.environ.get('GOLDEN_REDIS_URL', 'redis://127.0.0.1:6379/9')
AMQP_URL = os.environ.get('GOLDEN_AMQP_URL', 'amqp://guest:guest@127.0.0.1:5672//')
AMQP_HOST = os.environ.get('GOLDEN_AMQP_HOST', '127.0.0.1:5672')
PREFIX = golden_tasks.PREFIX
SEP = '\x06\x16'
FIXED_NOW = datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)


class FixedClockCelery(Celery):
    """A Celery app whose clock is stopped at FIXED_NOW (for countdown/expires)."""

    def now(self):
        return FIXED_NOW.astimezone(self.timezone)


# ---------------------------------------------------------------- scenarios

SCENARIOS = []


def scenario(name, description, messages=1, only55=False, brokers=('redis', 'amqp'), **conf):
    def deco(fn):
        if only55 and not V55:
            return fn
        SCENARIOS.append(dict(name=name, description=description, brokers=brokers,
                              messages=messages, conf=conf, fn=fn))
        return fn
    return deco


def T(app, name):
    return app.tasks['golden.' + name]


@scenario('delay', 'add.delay(2, 3): the plainest v2 message (task_routes sends it to the queue)',
          task_routes={'golden.add': {'queue': PREFIX + 'delay'}})
def _delay(app, q):
    T(app, 'add').delay(2, 3)


@scenario('countdown', 'apply_async((2, 3), countdown=10): eta = now + 10 s (UTC app)')
def _countdown(app, q):
    T(app, 'add').apply_async((2, 3), countdown=10, queue=q)


@scenario('countdown_kolkata',
          'apply_async((2, 3), countdown=10, expires=120) with timezone=Asia/Kolkata: '
          'eta/expires carry +05:30',
          timezone='Asia/Kolkata')
def _countdown_kolkata(app, q):
    T(app, 'add').apply_async((2, 3), countdown=10, expires=120, queue=q)


@scenario('eta_naive', 'apply_async(eta=datetime(2030, 1, 1, 12, 0)): a naive eta is sent naive')
def _eta_naive(app, q):
    T(app, 'add').apply_async((2, 3), eta=datetime(2030, 1, 1, 12, 0, 0), queue=q)


@scenario('eta_offset',
          'apply_async(eta=<aware datetime in America/St_Johns, -03:30>) passes the offset through')
def _eta_offset(app, q):
    eta = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=ZoneInfo('America/St_Johns'))
    T(app, 'add').apply_async((2, 3), eta=eta, queue=q)


@scenario('expires', 'apply_async((2, 3), expires=60): absolute expires, AMQP expiration "60000"')
def _expires(app, q):
    T(app, 'add').apply_async((2, 3), expires=60, queue=q)


@scenario('priority', 'apply_async((2, 3), priority=5): Redis band list <q>\\x06\\x163')
def _priority(app, q):
    T(app, 'add').apply_async((2, 3), priority=5, queue=q)


@scenario('routed',
          'explicit queue, exchange and routing key: delivery_info is not the anonymous exchange',
          task_queues=None)  # set per broker in run_publish_scenarios
def _routed(app, q):
    T(app, 'add').apply_async((2, 3), queue=q, exchange=q + '_ex', routing_key=q + '.rk')


@scenario('link', 'apply_async((2, 3), link=tsum.s(), link_error=echo.s())')
def _link(app, q):
    T(app, 'add').apply_async((2, 3), link=T(app, 'tsum').s(), link_error=T(app, 'echo').s(),
                              queue=q)


@scenario('chain', 'chain(add.s(1, 2), add.s(3), tsum.s()): first message, embed.chain reversed')
def _chain(app, q):
    chain(T(app, 'add').s(1, 2), T(app, 'add').s(3), T(app, 'tsum').s()).apply_async(queue=q)


@scenario('group', 'group(add.s(1, 1), add.s(2, 2)): two messages with a common group id',
          messages=2)
def _group(app, q):
    group(T(app, 'add').s(1, 1), T(app, 'add').s(2, 2)).apply_async(queue=q)


@scenario('chord',
          'chord([add.s(1, 1), add.s(2, 2)], tsum.s()): header members with group, '
          'group_index and embed.chord (the chord size key is in captures.json)',
          messages=2)
def _chord(app, q):
    chord([T(app, 'add').s(1, 1), T(app, 'add').s(2, 2)], T(app, 'tsum').s()).apply_async(queue=q)


@scenario('protocol1', 'task_protocol=1, countdown=10, link=tsum.s(): everything in the body',
          task_protocol=1)
def _protocol1(app, q):
    T(app, 'add').apply_async((2, 3), countdown=10, link=T(app, 'tsum').s(), queue=q)


@scenario('msgpack', "serializer='msgpack' with str, bytes, float, None, nested values",
          accept_content=['json', 'msgpack'])
def _msgpack(app, q):
    T(app, 'echo').apply_async(
        (2, 'три', b'\x00\xffraw', [1.5, None, True]),
        {'k': {'nested': [1, 2]}, 'neg': -7, 'big': 2 ** 63 - 1},
        serializer='msgpack', queue=q)


@scenario('compress_gzip', "compression='gzip': zlib stream, header compression=application/x-gzip")
def _gzip(app, q):
    T(app, 'add').apply_async((2, 3), compression='gzip', queue=q)


@scenario('compress_bz2', "compression='bzip2': header compression=application/x-bz2")
def _bz2(app, q):
    T(app, 'add').apply_async((2, 3), compression='bzip2', queue=q)


@scenario('timelimit', 'time_limit=30, soft_time_limit=20.5: timelimit header is [hard, soft]')
def _timelimit(app, q):
    T(app, 'add').apply_async((2, 3), time_limit=30, soft_time_limit=20.5, queue=q)


@scenario('unicode_nested', 'unicode strings, nested lists/objects, big and negative ints, floats')
def _unicode(app, q):
    T(app, 'echo').apply_async(
        ('héllo wörld ☃ 日本語 😀', {'nested': [1, [2, {'deep': None}], True, 1.5]},
         2 ** 70, -2 ** 63, 1e300, 0.1),
        {'ключ': 'значение', 'emoji': '😀', 'empty': {}, 'list': [], 'quote': 'a"b\\c\n'},
        queue=q)


@scenario('typed_args',
          'datetime, date, Decimal, UUID args as kombu 5.2 encodes them (plain strings)')
def _typed(app, q):
    T(app, 'echo').apply_async(
        (datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc), Decimal('1.50'),
         _uuid_module.UUID('12345678-1234-5678-1234-567812345678')),
        {'d': date(2024, 1, 2), 'naive': datetime(2024, 1, 2, 3, 4, 5, 678901)},
        queue=q)


@scenario('custom_headers',
          "headers={'x-custom': 'v', 'ts': 1700000000000, ...}: merged at top level "
          "(ts is an AMQP 'L' field)")
def _headers(app, q):
    T(app, 'add').apply_async(
        (2, 3), queue=q,
        headers={'x-custom': 'v', 'ts': 1700000000000, 'x-nested': {'a': [1, 2]},
                 'x-flag': True, 'x-none': None, 'x-float': 1.25})


@scenario('options',
          'shadow, ignore_result, explicit root_id/parent_id/group_id/group_index, '
          'reply_to and an aware expires datetime')
def _options(app, q):
    T(app, 'add').apply_async(
        (2, 3), queue=q, shadow='golden.shadow_name', ignore_result=True,
        root_id='aaaaaaaa-0000-4000-8000-000000000001',
        parent_id='aaaaaaaa-0000-4000-8000-000000000002',
        group_id='aaaaaaaa-0000-4000-8000-000000000003', group_index=3,
        reply_to='golden-reply-to',
        expires=datetime(2030, 2, 3, 4, 5, 6, tzinfo=timezone.utc))


@scenario('bytes_header',
          "headers={'x-bin': b'\\xff\\x00raw', 'x-utf8': b'ok'} on AMQP: py-amqp writes "
          "both as long strings ('S'); the first is not valid UTF-8", brokers=('amqp',))
def _bytes_header(app, q):
    T(app, 'add').apply_async((2, 3), queue=q, headers={'x-bin': b'\xff\x00raw', 'x-utf8': b'ok'})


# Celery 5.5 only. They are numbered after the shared ones, so the shared
# scenarios keep their ids in both sets.

@scenario('typed_json',
          'kombu 5.3+ typed JSON of every kind: aware and naive datetime, date, time, '
          'Decimal, UUID, UTF-8 bytes ("bytes") and other bytes ("base64")', only55=True)
def _typed_json(app, q):
    T(app, 'echo').apply_async(
        (datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc),
         datetime(2024, 1, 2, 3, 4, 5), date(2024, 1, 2),
         _time_of_day(13, 14, 15, 161718), Decimal('-1.50'),
         _uuid_module.UUID('12345678-1234-5678-1234-567812345678'),
         b'utf8 \xc3\xa9', b'\x00\xff\xfe'),
        {'nested': {'when': datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=5, minutes=30))),
                    'amounts': [Decimal('0.1'), Decimal('1E+3')]}},
        queue=q)


class _Visitor:
    """A StampingVisitor (subclassed lazily: 5.2 has no celery.canvas.StampingVisitor)."""

    @staticmethod
    def make():
        from celery.canvas import StampingVisitor

        class V(StampingVisitor):
            def on_signature(self, sig, **headers):
                return {'monitoring_id': 'mon-1', 'tenant': ['acme', 7]}
        return V()


@scenario('stamped', 'add.s(2, 3).stamp(visitor=V()): stamped_headers and stamps', only55=True)
def _stamped(app, q):
    s = T(app, 'add').s(2, 3)
    s.stamp(visitor=_Visitor.make())
    s.apply_async(queue=q)


@scenario('stamped_chain',
          'chain(add.s(1, 2), add.s(3), tsum.s()).stamp(visitor=V()): the stamps are in the '
          'headers and in every embedded step\'s options', only55=True)
def _stamped_chain(app, q):
    c = chain(T(app, 'add').s(1, 2), T(app, 'add').s(3), T(app, 'tsum').s())
    c.stamp(visitor=_Visitor.make())
    c.apply_async(queue=q)


@scenario('stamped_chord',
          'chord([add.s(1, 1), add.s(2, 2)], tsum.s()).stamp(visitor=V()): header members '
          'stamped, the body in embed.chord stamped too', messages=2, only55=True)
def _stamped_chord(app, q):
    c = chord([T(app, 'add').s(1, 1), T(app, 'add').s(2, 2)], T(app, 'tsum').s())
    c.stamp(visitor=_Visitor.make())
    c.apply_async(queue=q)


def _time_of_day(*a):
    from datetime import time as tod
    return tod(*a)


# ------------------------------------------------------------------- helpers

def write(path, data):
    with open(os.path.join(OUT, path), 'wb') as f:
        f.write(data)


def _json_default(o):
    # AMQP header values JSON has no type for, in kombu's typed-JSON
    # envelopes: py-amqp's bytes (an 'S' that is not UTF-8, or 'x') and
    # timestamps ('T', as in x-death).
    if isinstance(o, (bytes, bytearray)):
        return {'__type__': 'base64', '__value__': base64.b64encode(bytes(o)).decode()}
    if isinstance(o, datetime):
        return {'__type__': 'datetime', '__value__': o.isoformat()}
    raise TypeError('%r is not JSON serializable' % (o,))


def write_json(path, obj):
    write(path, (json.dumps(obj, indent=1, ensure_ascii=False, default=_json_default) + '\n').encode())


def redis_client():
    return redis.Redis.from_url(REDIS_URL)


def amqp_conn():
    c = amqp.Connection(host=AMQP_HOST, userid='guest', password='guest', virtual_host='/')
    c.connect()
    return c


def redis_items(r, q):
    """All items of q's priority bands, in publish order, with their list keys."""
    out = []
    for suffix in ('', SEP + '3', SEP + '6', SEP + '9'):
        key = q + suffix
        for item in reversed(r.lrange(key, 0, -1)):  # LPUSH: newest first
            out.append((key, item))
    return out


def amqp_parts(msg):
    props = dict(msg.properties)
    headers = props.pop('application_headers', {}) or {}
    di = msg.delivery_info
    return {
        'delivery_info': {k: di[k] for k in ('exchange', 'routing_key', 'redelivered') if k in di},
        'properties': props,
        'headers': headers,
        'body': base64.b64encode(bytes(msg.body)).decode(),
    }


def amqp_get(q, n, timeout=10.0):
    """basic_get n messages from q (retrying until they arrive)."""
    conn = amqp_conn()
    try:
        # auto_decode=False keeps the body as the exact bytes on the wire.
        ch = amqp.Channel(conn, auto_decode=False)
        ch.open()
        got = []
        deadline = time.time() + timeout
        while len(got) < n:
            msg = ch.basic_get(q, no_ack=True)
            if msg is not None:
                got.append(amqp_parts(msg))
                continue
            if time.time() > deadline:
                raise RuntimeError('amqp: %d of %d messages in %s' % (len(got), n, q))
            time.sleep(0.05)
        if ch.basic_get(q, no_ack=True) is not None:
            raise RuntimeError('amqp: more than %d messages in %s' % (n, q))
        return got
    finally:
        conn.close()


def amqp_declare(q):
    conn = amqp_conn()
    try:
        ch = conn.channel()
        ch.queue_declare(q, durable=True, auto_delete=False)
    finally:
        conn.close()


def amqp_cleanup(names):
    """Delete the golden_* queues and exchanges (404s are fine)."""
    conn = amqp_conn()
    try:
        for name in sorted(names):
            for op in ('queue_delete', 'exchange_delete'):
                ch = conn.channel()
                try:
                    getattr(ch, op)(name)
                except amqp.exceptions.NotFound:
                    continue
                try:
                    ch.close()
                except Exception:
                    pass
    finally:
        conn.close()


def filenames(name, n, ext):
    if n == 1:
        return [name + ext]
    return ['%s_%d%s' % (name, i, ext) for i in range(n)]


# ---------------------------------------------------------- publish phase

def run_publish_scenarios(manifest, amqp_names):
    r = redis_client()
    for idx, sc in enumerate(SCENARIOS, start=1):
        name, n = sc['name'], sc['messages']
        q = PREFIX + name
        amqp_names.update({q, q + '_ex'})
        entry = {'description': sc['description'], 'queue': q, 'files': {}}
        for broker, url in (('redis', REDIS_URL), ('amqp', AMQP_URL)):
            if broker not in sc['brokers']:
                continue
            conf = dict(sc['conf'])
            if 'task_queues' in conf:
                conf['task_queues'] = [Queue(q, Exchange(q + '_ex', type='direct'),
                                             routing_key=q + '.rk')]
            app = golden_tasks.make_app('golden_capture', broker=url, backend=REDIS_URL,
                                        app_cls=FixedClockCelery, **conf)
            IDS.reset(idx)  # same ids for both brokers
            sc['fn'](app, q)
            entry.setdefault('origin', anon_nodename())
            entry.setdefault('reply_to', {})[broker] = app.thread_oid
            if broker == 'redis':
                items = redis_items(r, q)
                if len(items) != n:
                    raise RuntimeError('%s: %d redis items, want %d' % (name, len(items), n))
                files = filenames(name, n, '.redis.json')
                for fn, (key, item) in zip(files, items):
                    write(fn, item)
                entry['files']['redis'] = files
                entry['redis_keys'] = [key for key, _ in items]
                for key, _ in items:
                    r.delete(key)
            else:
                parts = amqp_get(q, n)
                files = filenames(name, n, '.amqp.json')
                for fn, p in zip(files, parts):
                    write_json(fn, p)
                entry['files']['amqp'] = files
            if name == 'chord':
                # The client writes the chord size before the last header task.
                keys = sorted(k.decode() for k in r.keys('celery-taskset-meta-*.s'))
                entry.setdefault('chord_size_keys', {})[broker] = {
                    k: r.get(k).decode() for k in keys}
                for k in keys:
                    r.delete(k)
            app.close()
        manifest['scenarios'][name] = entry
        print('captured', name, file=sys.stderr)


# ----------------------------------------------------------- worker phase

class Worker:
    """A real `celery worker --pool=solo` on the golden_tasks app."""

    def __init__(self, name, queues, env):
        self.name = name
        # The Celery under test (5.5's directory) stays on the path after HERE.
        path = os.pathsep.join(p for p in (HERE, os.environ.get('PYTHONPATH')) if p)
        e = dict(os.environ, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE='1', **env)
        self.proc = subprocess.Popen(
            [sys.executable, '-m', 'celery', '-A', 'golden_tasks:worker_app', 'worker',
             '--pool=solo', '-Q', queues, '-n', name + '@golden', '--without-gossip',
             '--without-mingle', '--without-heartbeat', '--loglevel=INFO'],
            cwd=HERE, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.log = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.ready.wait(60):
            self.stop()
            raise RuntimeError('worker %s not ready:\n%s' % (name, ''.join(self.log)))

    def _read(self):
        for line in self.proc.stdout:
            self.log.append(line)
            if ' ready.' in line:
                self.ready.set()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.reader.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        if exc[0] is not None:
            sys.stderr.write(''.join(self.log))


def wait_meta(r, task_id, states, timeout=30.0, poll=0.02):
    """Poll celery-task-meta-<id> until its status is in states; return raw bytes."""
    key = 'celery-task-meta-' + task_id
    deadline = time.time() + timeout
    while time.time() < deadline:
        raw = r.get(key)
        if raw is not None:
            try:
                status = json.loads(raw)['status']
            except ValueError:  # msgpack
                import msgpack
                status = msgpack.unpackb(raw, raw=False)['status']
            if status in states:
                return raw
        time.sleep(poll)
    raise RuntimeError('no %s meta for %s' % (states, task_id))


def wait_list(r, key, n, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        items = r.lrange(key, 0, -1)
        if len(items) >= n:
            return list(reversed(items))
        time.sleep(0.05)
    raise RuntimeError('no message in %s' % key)


def run_redis_worker_phase(manifest):
    r = redis_client()
    wq, out = PREFIX + 'work', PREFIX + 'retry_out'
    results = manifest['results']
    app = golden_tasks.make_app('golden_client', broker=REDIS_URL, backend=REDIS_URL)
    IDS.reset(100)
    with Worker('golden_a', wq, {'GOLDEN_BROKER': REDIS_URL, 'GOLDEN_BACKEND': REDIS_URL}):
        res = T(app, 'add').apply_async((2, 3), queue=wq)
        write('result_success.json', wait_meta(r, res.id, {'SUCCESS'}))
        results['result_success.json'] = 'add(2, 3) SUCCESS'

        res = T(app, 'fail').apply_async(('bad thing',), queue=wq)
        write('result_failure.json', wait_meta(r, res.id, {'FAILURE'}))
        results['result_failure.json'] = "fail('bad thing') raises ValueError: FAILURE"

        res = T(app, 'fail_custom').apply_async(('bad', 42), queue=wq)
        write('result_failure_custom.json', wait_meta(r, res.id, {'FAILURE'}))
        results['result_failure_custom.json'] = (
            "fail_custom('bad', 42) raises golden_tasks.GoldenError('bad', 42): FAILURE")

        res = T(app, 'retry_me').apply_async(
            (1, out), queue=wq, headers={'x-trace': 'abc'}, time_limit=60,
            soft_time_limit=50)
        write('result_retry.json', wait_meta(r, res.id, {'RETRY'}))
        results['result_retry.json'] = 'retry_me: self.retry(exc=KeyError) RETRY'
        (item,) = wait_list(r, out, 1)
        write('retried.redis.json', item)
        manifest['scenarios']['retried'] = {
            'description': 'the retry a real 5.2 worker published for retry_me(1, ...) sent with '
                           "headers={'x-trace': 'abc'}, time_limit=60, soft_time_limit=50 "
                           '(self.retry(exc=KeyError, countdown=30, queue=...)). No expires: '
                           'celery 5.2.6 cannot retry a task that has one (send_task compares '
                           'the ISO string with 0 and the retry ends in Reject(TypeError))',
            'queue': out, 'files': {'redis': ['retried.redis.json']}, 'redis_keys': [out],
            'task_id': res.id}

        expired = datetime.now(timezone.utc) - timedelta(seconds=30)
        res = T(app, 'add').apply_async((1, 2), queue=wq, expires=expired)
        write('result_revoked_expired.json', wait_meta(r, res.id, {'REVOKED'}))
        results['result_revoked_expired.json'] = 'add(1, 2) with expires in the past: REVOKED'

        res = T(app, 'slow').apply_async((2,), queue=wq)
        write('result_started.json', wait_meta(r, res.id, {'STARTED'}))
        results['result_started.json'] = 'slow(2) with track_started=True: STARTED'
        wait_meta(r, res.id, {'SUCCESS'})

        g = group(T(app, 'add').s(1, 1), T(app, 'add').s(2, 2)).apply_async(queue=wq)
        write('result_group_member.json', wait_meta(r, g.results[0].id, {'SUCCESS'}))
        results['result_group_member.json'] = 'first member of group(add.s(1, 1), add.s(2, 2))'
        wait_meta(r, g.results[1].id, {'SUCCESS'})

        c = chain(T(app, 'add').s(1, 2), T(app, 'add').s(3)).apply_async(queue=wq)
        write('result_chain_parent.json', wait_meta(r, c.parent.id, {'SUCCESS'}))
        results['result_chain_parent.json'] = (
            'first step of chain(add.s(1, 2), add.s(3)): children = [next step]')
        # The next step goes to the default queue, which this worker does not
        # consume: it is a message published by a real worker.
        (item,) = wait_list(r, PREFIX + 'default', 1)
        write('chain_next.redis.json', item)
        manifest['scenarios']['chain_next'] = {
            'description': 'second step of chain(add.s(1, 2), add.s(3)) as published by a real '
                           '5.2 worker after the first step returned 3',
            'queue': PREFIX + 'default', 'files': {'redis': ['chain_next.redis.json']},
            'redis_keys': [PREFIX + 'default'], 'task_id': c.id, 'parent_id': c.parent.id}

        # What the worker derives from a protocol 1 message
        # (proto1_to_proto2: argsrepr = saferepr of the decoded list).
        app1 = golden_tasks.make_app('golden_client', broker=REDIS_URL, backend=REDIS_URL,
                                     task_protocol=1)
        res = T(app1, 'reqinfo').apply_async((4, 5), {'k': 'v'}, queue=wq)
        write('result_reqinfo_proto1.json', wait_meta(r, res.id, {'SUCCESS'}))
        results['result_reqinfo_proto1.json'] = (
            'reqinfo(4, 5, k="v") sent with task_protocol=1: the argsrepr/kwargsrepr the '
            'worker derived')
        app1.close()

        if V55:
            stamped_worker_messages(app, r, wq, manifest)
    app.close()

    IDS.reset(200)
    app = golden_tasks.make_app('golden_client', broker=REDIS_URL, backend=REDIS_URL)
    with Worker('golden_b', wq, {'GOLDEN_BROKER': REDIS_URL, 'GOLDEN_BACKEND': REDIS_URL,
                                 'GOLDEN_EXTENDED': '1'}):
        res = T(app, 'add').apply_async((2,), {'y': 3}, queue=wq)
        write('result_extended_success.json', wait_meta(r, res.id, {'SUCCESS'}))
        results['result_extended_success.json'] = 'add(2, y=3) with result_extended=True'
        res = T(app, 'fail').apply_async(('bad thing',), queue=wq)
        write('result_extended_failure.json', wait_meta(r, res.id, {'FAILURE'}))
        results['result_extended_failure.json'] = "fail('bad thing') with result_extended=True"
    app.close()

    IDS.reset(300)
    app = golden_tasks.make_app('golden_client', broker=REDIS_URL, backend=REDIS_URL,
                                result_serializer='msgpack',
                                accept_content=['json', 'msgpack'],
                                result_accept_content=['json', 'msgpack'])
    with Worker('golden_c', wq, {'GOLDEN_BROKER': REDIS_URL, 'GOLDEN_BACKEND': REDIS_URL,
                                 'GOLDEN_RESULT_SERIALIZER': 'msgpack'}):
        res = T(app, 'echo').apply_async(('x', 1.5), {'k': None}, queue=wq)
        write('result_success.msgpack', wait_meta(r, res.id, {'SUCCESS'}))
        results['result_success.msgpack'] = "echo('x', 1.5, k=None) with result_serializer=msgpack"
    app.close()


def stamped_worker_messages(app, r, wq, manifest):
    """5.5: a stamped task's retry and a stamped chain's next step, as the
    worker publishes them; and the request a stamped task sees."""
    results = manifest['results']
    out, nxt = PREFIX + 'retry_out_stamped', PREFIX + 'stamped_next'
    s = T(app, 'retry_me').s(1, out)
    s.stamp(visitor=_Visitor.make())
    res = s.apply_async(queue=wq)
    (item,) = wait_list(r, out, 1)
    write('retried_stamped.redis.json', item)
    manifest['scenarios']['retried_stamped'] = {
        'description': 'the retry a real 5.5 worker published for retry_me(1, ...) stamped with '
                       'V (self.retry(exc=KeyError, countdown=30, queue=...))',
        'queue': out, 'files': {'redis': ['retried_stamped.redis.json']}, 'redis_keys': [out],
        'task_id': res.id}

    c = chain(T(app, 'add').s(1, 2), T(app, 'add').s(3).set(queue=nxt))
    c.stamp(visitor=_Visitor.make())
    c = c.apply_async(queue=wq)
    (item,) = wait_list(r, nxt, 1)
    write('chain_next_stamped.redis.json', item)
    manifest['scenarios']['chain_next_stamped'] = {
        'description': 'second step of chain(add.s(1, 2), add.s(3)).stamp(visitor=V()) as a '
                       'real 5.5 worker published it',
        'queue': nxt, 'files': {'redis': ['chain_next_stamped.redis.json']},
        'redis_keys': [nxt], 'task_id': c.id, 'parent_id': c.parent.id}

    s = T(app, 'reqinfo').s(1)
    s.stamp(visitor=_Visitor.make())
    res = s.apply_async(queue=wq)
    write('result_reqinfo_stamped.json', wait_meta(r, res.id, {'SUCCESS'}))
    results['result_reqinfo_stamped.json'] = 'reqinfo(1) stamped with V: the stamps the task sees'


def run_ndd_phase(manifest, amqp_names):
    """5.5 native delayed delivery: a countdown and an eta task on a quorum
    queue, captured as they enter celery_delayed_27 and as they come out of
    the levels into the queue. The topology is kombu's own; it is removed at
    the end unless it existed before."""
    from kombu import Connection
    from kombu.transport.native_delayed_delivery import (
        bind_queue_to_native_delayed_delivery_exchange,
        declare_native_delayed_delivery_exchanges_and_queues)
    q, tap = PREFIX + 'ndd', PREFIX + 'ndd_tap'
    amqp_names.update({q, tap})
    queue = Queue(q, Exchange(q, type='topic'), routing_key=q,
                  queue_arguments={'x-queue-type': 'quorum'})
    conn = amqp_conn()
    try:
        existed = True
        try:
            conn.channel().exchange_declare('celery_delayed_27', 'topic', passive=True)
        except amqp.exceptions.NotFound:
            existed = False
    finally:
        conn.close()
    with Connection(AMQP_URL) as kconn:
        declare_native_delayed_delivery_exchanges_and_queues(kconn, 'quorum')
        queue.bind(kconn.default_channel).declare()
        bind_queue_to_native_delayed_delivery_exchange(kconn, queue)
        # The tap sees each message as the producer published it.
        tq = Queue(tap, Exchange('celery_delayed_27', type='topic'), routing_key='#.' + q,
                   durable=False, auto_delete=False)
        tq.bind(kconn.default_channel).declare()
    try:
        cases = [
            (50, 'ndd_countdown', 'apply_async((2, 3), countdown=2) on a quorum queue: published '
                                  'to celery_delayed_27 with the 28 bits of 2 before the key',
             lambda app: T(app, 'add').apply_async((2, 3), countdown=2)),
            (51, 'ndd_eta', 'apply_async((2, 3), eta=now + 3 s) on a quorum queue: the countdown '
                            'is recomputed from the eta (3 = bits 1 and 0)',
             lambda app: T(app, 'add').apply_async((2, 3), eta=FIXED_NOW + timedelta(seconds=3))),
        ]
        for ns, name, desc, fn in cases:
            app = golden_tasks.make_app('golden_capture', broker=AMQP_URL, backend=REDIS_URL,
                                        app_cls=FixedClockCelery, task_queues=[queue])
            app.conf.task_default_queue = q
            IDS.reset(ns)
            fn(app)
            (pub,) = amqp_get(tap, 1)
            write_json(name + '.published.amqp.json', pub)
            (got,) = amqp_get(q, 1, timeout=30)
            write_json(name + '.amqp.json', got)
            manifest['scenarios'][name] = {
                'description': desc, 'queue': q, 'origin': anon_nodename(),
                'reply_to': {'amqp': app.thread_oid},
                'files': {'amqp': [name + '.published.amqp.json', name + '.amqp.json']}}
            app.close()
            print('captured', name, file=sys.stderr)
    finally:
        if not existed:
            conn = amqp_conn()
            try:
                for level in range(28):
                    n = 'celery_delayed_%d' % level
                    ch = conn.channel()
                    ch.queue_delete(n)
                    ch.exchange_delete(n)
                conn.channel().exchange_delete('celery_delayed_delivery')
            finally:
                conn.close()


def run_amqp_worker_phase(manifest, amqp_names):
    wq, out, reply = PREFIX + 'work_amqp', PREFIX + 'retry_out_amqp', PREFIX + 'rpc_reply'
    amqp_names.update({wq, out, reply})
    results = manifest['results']
    amqp_declare(out)
    amqp_declare(reply)
    IDS.reset(400)
    app = golden_tasks.make_app('golden_client', broker=AMQP_URL, backend='rpc://')
    with Worker('golden_d', wq, {'GOLDEN_BROKER': AMQP_URL, 'GOLDEN_BACKEND': 'rpc://'}):
        res = T(app, 'add').apply_async((2, 3), queue=wq, reply_to=reply)
        (p,) = amqp_get(reply, 1, timeout=30)
        write_json('result_rpc_success.amqp.json', p)
        results['result_rpc_success.amqp.json'] = 'RPC backend reply for add(2, 3)'

        res = T(app, 'fail').apply_async(('nope',), queue=wq, reply_to=reply)
        (p,) = amqp_get(reply, 1, timeout=30)
        write_json('result_rpc_failure.amqp.json', p)
        results['result_rpc_failure.amqp.json'] = "RPC backend reply for fail('nope')"

        res = T(app, 'retry_me').apply_async(
            (1, out), queue=wq, headers={'x-trace': 'abc'}, time_limit=60,
            soft_time_limit=50)
        (p,) = amqp_get(out, 1, timeout=30)
        write_json('retried.amqp.json', p)
        e = manifest['scenarios']['retried']
        e['files']['amqp'] = ['retried.amqp.json']
        e['amqp_task_id'] = res.id

        # py-amqp hands a worker bytes for an 'S' header that is not UTF-8.
        res = T(app, 'reqinfo').apply_async(
            (1,), queue=wq, reply_to=reply, headers={'x-bin': b'\xff\x00raw', 'x-utf8': b'ok'})
        (p,) = amqp_get(reply, 1, timeout=30)
        write_json('result_rpc_reqinfo_bytes.amqp.json', p)
        results['result_rpc_reqinfo_bytes.amqp.json'] = (
            "reqinfo(1) with headers={'x-bin': b'\\xff\\x00raw', 'x-utf8': b'ok'}: the "
            "Python types the worker saw")
    app.close()


def main():
    os.makedirs(OUT, exist_ok=True)
    r = redis_client()
    r.flushdb()  # db 9 belongs to the capture
    manifest = {
        'generated_by': 'protocol/testdata/capture/capture.py',
        'versions': {'celery': celery.__version__, 'kombu': kombu.__version__,
                     'redis-py': redis.__version__, 'py-amqp': amqp.__version__,
                     'python': sys.version.split()[0]},
        'fixed_now': FIXED_NOW.isoformat(),
        'scenarios': {},
        'results': {},
    }
    amqp_names = {PREFIX + 'default'}
    try:
        run_publish_scenarios(manifest, amqp_names)
        run_redis_worker_phase(manifest)
        run_amqp_worker_phase(manifest, amqp_names)
        if V55:
            run_ndd_phase(manifest, amqp_names)
    finally:
        r.flushdb()
        amqp_cleanup(amqp_names)
    write_json('captures.json', manifest)
    print('wrote', OUT, file=sys.stderr)


if __name__ == '__main__':
    main()
