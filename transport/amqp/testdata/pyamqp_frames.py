"""Writes the AMQP frames py-amqp produces for a Celery task message whose
headers hold integers outside int32 (tag 'L'), as RabbitMQ delivers them to
a consumer: basic.deliver, the content header exactly as py-amqp serialized
it (RabbitMQ passes it through unchanged), and the body.

Regenerate with Debian's py-amqp 5.1.1:
    /usr/bin/python3 testdata/pyamqp_frames.py > testdata/pyamqp_deliver_L.bin
"""
import sys
from decimal import Decimal

from amqp.basic_message import Message
from amqp.method_framing import frame_writer
from amqp.serialization import dumps


class Conn:
    frame_max = 131072
    bytes_sent = 0


class Sink:
    def __init__(self):
        self.data = bytearray()

    def write(self, b):
        self.data += bytes(b)


tid = "a1000000-0000-0000-0000-000000000001"
headers = {
    "lang": "py", "task": "tasks.add", "id": tid, "shadow": None, "eta": None,
    "expires": None, "group": None, "group_index": None, "retries": 0,
    "timelimit": [None, None], "root_id": tid, "parent_id": None,
    "argsrepr": "(2, 3)", "kwargsrepr": "{}", "origin": "gen1@host",
    "ignore_result": False,
    # the hazard: ints outside int32 are written with tag 'L'
    "ts": 1700000000000,
    "neg": -5000000000,
    "edge": -2147483648,
    "small": 7,
    "ratio": 0.25,
    "price": Decimal("12.34"),
    "nested": {"big": 2 ** 40, "list": [1, 3000000000, {"deep": -(2 ** 62)}], "s": "L"},
}
body = b'[[2, 3], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'
msg = Message(body, content_type="application/json", content_encoding="utf-8",
              application_headers=headers, delivery_mode=2, priority=5,
              correlation_id=tid, reply_to="e7d884b3-329b-3e65-828a-03519b78a61c")
sink = Sink()
write = frame_writer(Conn(), sink)
# basic.deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
args = dumps("sLbss", ("ctag-L", 1, False, "", "at_L"))
write(1, 1, (60, 60), args, msg)
sys.stdout.buffer.write(sink.data)
