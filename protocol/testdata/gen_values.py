#!/usr/bin/python3
"""Regenerate protocol/testdata/python_values.json, the Python cross-check
fixtures for the protocol value codecs (values_python_test.go).

Run from the repository root with Debian's interpreter, which has Celery,
kombu and msgpack installed:

    /usr/bin/python3 protocol/testdata/gen_values.py

Everything expected in the fixture is computed by Python itself: the JSON
and msgpack bytes come from Python's json/kombu/msgpack, and the expected
decoded values are what Python decodes from those bytes. Decoded values are
written in a tagged form that keeps Python's types:

    ["none"] ["bool", b] ["int", "<digits>"] ["float", "<repr>"] ["str", s]
    ["bytes", "<base64>"] ["list", [...]] ["dict", [[key, value], ...]]
    ["datetime", [y, mo, d, h, mi, s, us, offset_seconds_or_null]]
    ["date", [y, mo, d]] ["time", [h, mi, s, us]] ["decimal", "<str>"]
    ["uuid", "<hex>"] ["timestamp", [seconds, nanoseconds]] ["ext", [code, "<base64>"]]

kombu >= 5.3 writes typed envelopes ({"__type__", "__value__"}); the
installed kombu is 5.2, so the envelope writer and reader below follow
kombu 5.3's documented behaviour (see shared/docs/celery-protocol.md 2.2).
"""

import base64
import bz2
import datetime as dt
import gzip
import decimal
import json
import math
import os
import struct
import sys
import uuid
import zlib

import msgpack
from celery.utils.saferepr import saferepr
from kombu.utils import json as kombu52_json

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_values.json")

UTC = dt.timezone.utc
IST = dt.timezone(dt.timedelta(hours=5, minutes=30))
PST = dt.timezone(dt.timedelta(hours=-8))
UID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def tag(o):
    """Python value -> tagged form (see the module docstring)."""
    if o is None:
        return ["none"]
    # msgpack extension values, before tuple (ExtType is a namedtuple).
    if isinstance(o, msgpack.Timestamp):
        return ["timestamp", [o.seconds, o.nanoseconds]]
    if isinstance(o, msgpack.ExtType):
        return ["ext", [o.code, base64.b64encode(o.data).decode()]]
    if isinstance(o, bool):
        return ["bool", o]
    if isinstance(o, int):
        return ["int", str(o)]
    if isinstance(o, float):
        return ["float", repr(o)]
    if isinstance(o, str):
        return ["str", o]
    if isinstance(o, (bytes, bytearray)):
        return ["bytes", base64.b64encode(bytes(o)).decode()]
    if isinstance(o, (list, tuple)):
        return ["list", [tag(x) for x in o]]
    if isinstance(o, dict):
        # A bin key (msgpack) is compared as its text: celeriac keys are strings.
        return ["dict", [[k.decode() if isinstance(k, bytes) else k, tag(v)] for k, v in o.items()]]
    if isinstance(o, dt.datetime):
        off = o.utcoffset()
        return ["datetime", [o.year, o.month, o.day, o.hour, o.minute, o.second,
                             o.microsecond, None if off is None else int(off.total_seconds())]]
    if isinstance(o, dt.date):
        return ["date", [o.year, o.month, o.day]]
    if isinstance(o, dt.time):
        return ["time", [o.hour, o.minute, o.second, o.microsecond]]
    if isinstance(o, decimal.Decimal):
        return ["decimal", str(o)]
    if isinstance(o, uuid.UUID):
        return ["uuid", o.hex]
    raise TypeError(type(o))


def sort_dicts(o):
    """Rebuild dicts with sorted keys: Go maps have no order, so celeriac
    renders them sorted and the Python side must do the same."""
    if isinstance(o, dict):
        return {k: sort_dicts(o[k]) for k in sorted(o)}
    if isinstance(o, list):
        return [sort_dicts(x) for x in o]
    if isinstance(o, tuple):
        return tuple(sort_dicts(x) for x in o)
    return o


# --- kombu >= 5.3 typed envelopes ------------------------------------------

def _env(t, v):
    return {"__type__": t, "__value__": v}


class TypedEncoder(json.JSONEncoder):
    """Writes values JSON lacks as kombu >= 5.3 does."""

    def default(self, o):
        if isinstance(o, dt.datetime):
            return _env("datetime", o.isoformat())
        if isinstance(o, dt.date):
            return _env("date", o.isoformat())
        if isinstance(o, dt.time):
            return _env("time", o.isoformat())
        if isinstance(o, decimal.Decimal):
            return _env("decimal", str(o))
        if isinstance(o, uuid.UUID):
            return _env("uuid", {"hex": o.hex})
        if isinstance(o, bytes):
            try:
                return _env("bytes", o.decode("utf-8"))
            except UnicodeDecodeError:
                return _env("base64", base64.b64encode(o).decode())
        return super().default(o)


class PlainEncoder(json.JSONEncoder):
    """Writes values JSON lacks in celeriac's default (plain) forms:
    isoformat text, str(), canonical UUID, UTF-8 text for bytes (a base64
    envelope when not UTF-8)."""

    def default(self, o):
        if isinstance(o, (dt.datetime, dt.date, dt.time)):
            return o.isoformat()
        if isinstance(o, (decimal.Decimal, uuid.UUID)):
            return str(o)
        if isinstance(o, bytes):
            try:
                return o.decode("utf-8")
            except UnicodeDecodeError:
                return _env("base64", base64.b64encode(o).decode())
        return super().default(o)


_typed_decoders = {
    "datetime": dt.datetime.fromisoformat,
    "date": lambda o: dt.datetime.fromisoformat(o).date(),
    "time": dt.time.fromisoformat,
    "decimal": decimal.Decimal,
    "uuid": lambda o: uuid.UUID(**o),
    "bytes": lambda o: o.encode("utf-8"),
    "base64": lambda o: base64.b64decode(o.encode("utf-8")),
}


def typed_hook(o):
    if o.keys() == {"__type__", "__value__"}:
        dec = _typed_decoders.get(o["__type__"])
        if dec is None:
            raise ValueError("Unsupported type", o)
        return dec(o["__value__"])
    return o


def loads53(s):
    return json.loads(s, object_hook=typed_hook)


# --- values -----------------------------------------------------------------

def typical_body():
    return [[2, 3], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]


def nested_body():
    sig = {"task": "tasks.step", "args": [1, 2.5, "x"], "kwargs": {"k": "v\u00e9"},
           "options": {"task_id": "5a122715-4b1d-4c39-9f7d-1b7a0e0f2c11",
                       "reply_to": "2731d639-4e7d-349f-9ccc-abfd40bea425", "priority": 5},
           "subtask_type": None, "immutable": False}
    return [[{"order": {"id": 12345678901, "lines": [{"sku": "A-%d" % i, "qty": i, "price": i * 1.25,
                                                      "tags": ["red", "big"], "note": None}
                                                     for i in range(12)]},
              "user": {"name": "Zo\u00eb \u00c5ngstr\u00f6m", "email": "zoe@example.com", "vip": True}}],
            {"retry": 3, "timeout": 30.0},
            {"callbacks": [sig], "errbacks": None, "chain": [sig, sig], "chord": None}]


VALUES = [
    ("none", None), ("true", True), ("false", False),
    ("int_0", 0), ("int_1", 1), ("int_neg", -1), ("int_255", 255), ("int_256", 256),
    ("int_2p31", 2**31), ("int_2p53p1", 2**53 + 1), ("int_max64", 2**63 - 1), ("int_min64", -2**63),
    ("int_2p63", 2**63), ("int_below_min64", -2**63 - 1), ("int_2p64", 2**64),
    ("int_1e30", 10**30), ("int_neg_1e40", -10**40),
    ("float_0", 0.0), ("float_neg0", -0.0), ("float_1", 1.0), ("float_1_5", 1.5), ("float_0_1", 0.1),
    ("float_1e16", 1e16), ("float_1e15", 1e15), ("float_big", 123456789012345678.0),
    ("float_1e-5", 1e-5), ("float_1e-4", 0.0001), ("float_1e-7", 1e-7), ("float_1e300", 1e300),
    ("float_min_sub", 5e-324), ("float_2_5e-10", 2.5e-10), ("float_pi", math.pi),
    ("float_third", 1 / 3), ("float_neg_1_5e20", -1.5e20), ("float_nan", float("nan")),
    ("float_inf", float("inf")), ("float_neg_inf", float("-inf")),
    ("str_empty", ""), ("str_hello", "hello"), ("str_single_quote", "it's"),
    ("str_double_quote", 'say "hi"'), ("str_both_quotes", "both ' and \""),
    ("str_controls", "tab\tnl\ncr\rbs\x08ff\x0c nul\x00 us\x1f del\x7f"), ("str_backslash", "a\\b"),
    ("str_latin1", "caf\u00e9 \u00a0nbsp \u00ad shy"), ("str_c1", "\x80\x9f"), ("str_cjk", "\u65e5\u672c\u8a9e"),
    ("str_emoji", "\U0001F600 grin"), ("str_zero_width", "a\u200bb"), ("str_line_sep", "a\u2028b\u2029"),
    ("str_private_use", "\ue000"), ("str_bmp_edge", "\ud7ff\uffff"), ("str_html", "<a href='x'>&amp;</a>"),
    ("bytes_empty", b""), ("bytes_raw", b"raw"), ("bytes_binary", b"\x00\xff\xfe"),
    ("bytes_quote", b"it's"), ("bytes_controls", b"\t\n\r\x7f\x80"),
    ("list_empty", []), ("list_mixed", [1, "a", None, True, 2.0]),
    ("list_nested", [1, [2, [3, [4, [5, []]]]]]), ("list_deep", [[[[["deep"]]]]]),
    ("dict_empty", {}), ("dict_simple", {"a": 1}),
    ("dict_nested", {"b": {"c": [1, 2.5, "x"], "d": {}}, "a": None, "\u043a\u043b\u044e\u0447": "\u0437\u043d\u0430\u0447\u0435\u043d\u0438\u0435"}),
    ("dict_envelope_like", {"__type__": "datetime", "__value__": "x", "extra": 1}),
    ("datetime_utc", dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ("datetime_ist_us", dt.datetime(2026, 11, 29, 18, 49, 39, 713054, tzinfo=IST)),
    ("datetime_pst", dt.datetime(1999, 12, 31, 23, 59, 0, tzinfo=PST)),
    ("datetime_naive", dt.datetime(2030, 1, 1, 12, 0)),
    ("date", dt.date(2024, 1, 2)), ("time", dt.time(1, 2, 3)), ("time_us", dt.time(23, 59, 59, 999999)),
    ("time_zero", dt.time(0, 0)),
    ("decimal", decimal.Decimal("1.50")), ("decimal_neg0", decimal.Decimal("-0")),
    ("decimal_exp", decimal.Decimal("1E+3")), ("decimal_nan", decimal.Decimal("NaN")),
    ("uuid", UID),
    ("celery_5_6_echo", [dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), decimal.Decimal("1.5"), UID, b"raw",
                         {"d": dt.date(2024, 1, 2)}]),
    ("typical_body", typical_body()),
    ("nested_body", nested_body()),
]


def try_(fn, *a):
    try:
        return fn(*a)
    except (TypeError, ValueError, OverflowError):
        return None


def is_plain(o):
    """True for values plain json.dumps can write."""
    return try_(json.dumps, o) is not None


def value_case(name, o):
    o = sort_dicts(o)
    case = {"name": name, "value": tag(o), "repr": repr(o)}
    # kombu 5.2 (installed) and the 5.3 envelope writer, and what Python
    # reads back from each.
    j52 = try_(kombu52_json.dumps, o)
    if j52 is not None:
        case["json_52"] = j52
        case["json_52_decoded"] = tag(json.loads(j52))
    j53 = json.dumps(o, cls=TypedEncoder)
    case["json_53"] = j53
    case["json_53_decoded"] = tag(loads53(j53))
    # Byte-exact expectations for celeriac's encoder (sorted keys, Python's
    # default separators, ensure_ascii).
    case["json_plain_sorted"] = json.dumps(o, cls=PlainEncoder, sort_keys=True)
    case["json_typed_sorted"] = json.dumps(o, cls=TypedEncoder, sort_keys=True)
    mp = try_(lambda x: msgpack.packb(x, use_bin_type=True), o) if is_plain_msgpack(o) else None
    if mp is not None:
        case["msgpack"] = base64.b64encode(mp).decode()
        case["msgpack_decoded"] = tag(msgpack.unpackb(mp, raw=False))
    case["saferepr"] = {str(n): saferepr(o, n) for n in (None, 1024, 40, 12, 5, 1)}
    return case


def is_plain_msgpack(o):
    """msgpack can carry None/bool/int64-ish/float/str/bytes/list/dict."""
    if isinstance(o, (dt.date, dt.time, decimal.Decimal, uuid.UUID)):
        return False
    if isinstance(o, (list, tuple)):
        return all(is_plain_msgpack(x) for x in o)
    if isinstance(o, dict):
        return all(is_plain_msgpack(x) for x in o.values())
    return True


# Raw JSON documents and what Python's json (with kombu 5.3's object hook)
# makes of them; "error" when Python refuses them.
JSON_INPUTS = [
    '0', '-0', '-0.0', '1E400', '-1e400', '1e-400', '1.5e+3', '12345678901234567890',
    '-12345678901234567890123', '9223372036854775807', '9223372036854775808', '-9223372036854775808',
    '-9223372036854775809', 'NaN', 'Infinity', '-Infinity', 'null', 'true', 'false',
    ' \t\n\r[1 , 2 ]\n', '{"a": 1, "a": 2}', '"\\u00e9\\/\\b\\f\\n\\r\\t\\"\\\\"', '"\\ud83d\\ude00"',
    '"\\uD83D\\uDE00"', '"\\u00E9"', '"\\ud800"', '"\\udc00x"', '"\\ud800\\u0041"', '"caf\u00e9"',
    '[]', '{}', '[[]]', '{"": ""}', '[1,]', '01', '00', '{"a"}', "'a'", '[1] x', 'nan', '-NaN', '"\x01"',
    '"\t"', '1.', '.5', '+1', 'tru', '"\\x41"', '"\\u12"', '"abc', '[1', '{"a":1', '', ' ', '1 2', '-', '--1',
    '1e', '1e+', '[1 2]', '{"a" 1}', '{1: 2}', 'Infinityx', '-Infinity1', '\ufeff1', '"\\uZZZZ"',
    '{"__type__": "datetime", "__value__": "2024-01-02T03:04:05+00:00"}',
    '{"__type__": "datetime", "__value__": "2024-01-02T03:04:05.123456+05:30"}',
    '{"__type__": "datetime", "__value__": "2024-01-02T03:04:05"}',
    '{"__type__": "date", "__value__": "2024-01-02"}',
    '{"__type__": "date", "__value__": "2024-01-02T23:30:00-05:00"}',
    '{"__type__": "time", "__value__": "01:02:03"}',
    '{"__type__": "time", "__value__": "01:02:03.000450"}',
    '{"__type__": "decimal", "__value__": "1.50"}',
    '{"__type__": "decimal", "__value__": "-1E-7"}',
    '{"__type__": "decimal", "__value__": 7}',
    '{"__type__": "decimal", "__value__": "abc"}',
    '{"__type__": "uuid", "__value__": {"hex": "12345678123456781234567812345678"}}',
    '{"__type__": "uuid", "__value__": {"hex": "12345678123456781234567812345678", "version": 4}}',
    '{"__type__": "uuid", "__value__": {"hex": "12345678-1234-5678-1234-567812345678"}}',
    '{"__type__": "uuid", "__value__": {"hex": "1234"}}',
    '{"__type__": "uuid", "__value__": {"hex": "12345678123456781234567812345678", "version": 9}}',
    '{"__type__": "bytes", "__value__": "raw"}',
    '{"__type__": "base64", "__value__": "/wA="}',
    '{"__type__": "base64", "__value__": "/wA"}',
    '{"__type__": "nope", "__value__": 1}',
    '{"__value__": "2024-01-02", "__type__": "date"}',
    '{"__type__": "date", "__value__": "2024-01-02", "x": 1}',
    '{"__type__": "date", "__type__": "date", "__value__": "2024-02-03"}',
    '[{"__type__": "bytes", "__value__": "a"}, {"k": {"__type__": "decimal", "__value__": "2"}}]',
]


def json_input_case(s):
    try:
        v = loads53(s)
    except Exception:  # noqa: BLE001 - any refusal counts
        return {"input": s, "error": True}
    return {"input": s, "value": tag(v)}


def msgpack_inputs():
    """Raw msgpack documents and what msgpack.unpackb(raw=False) makes of
    them."""
    docs = [
        msgpack.packb(2**64 - 1),
        msgpack.packb(-2**63),
        b"\xca" + struct.pack(">f", 0.1),  # float32
        msgpack.packb(msgpack.Timestamp(1, 5)),  # timestamp 32-ish
        msgpack.packb(msgpack.Timestamp(1700000000, 123456789)),  # timestamp 64
        msgpack.packb(msgpack.Timestamp(-1, 0)),  # timestamp 96
        msgpack.packb(msgpack.Timestamp(2**40, 1)),  # timestamp 96
        msgpack.packb({"a": b"\x00", "b": [1, 2.5]}, use_bin_type=True),
        b"\x81\xc4\x01k\x01",  # {b"k": 1}: a bin key
        b"\x81\x01\x02",  # {1: 2}: strict_map_key refuses it
        b"\xdd\xff\xff\xff\xff",  # array32 claiming 2**32-1 elements
        b"\xdf\xff\xff\xff\xff",  # map32 claiming 2**32-1 entries
        b"\xdb\xff\xff\xff\xff",  # str32 claiming 4 GiB
        b"\xa2\xff\xfe",  # str with invalid UTF-8
        b"\xc1",  # never-used code
        b"\x91",  # truncated array
        b"\x01\x02",  # extra data
        b"",  # empty
        b"\xd4\x05\x00",  # fixext1 of an unknown type
        b"\xd6\xff\x00\x00\x00\x01",  # timestamp32 via fixext4
    ]
    out = []
    for d in docs:
        try:
            v = msgpack.unpackb(d, raw=False)
            case = {"input": base64.b64encode(d).decode(), "value": tag(v)}
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
                UnicodeDecodeError, Exception) as e:  # noqa: BLE001 - any refusal counts
            case = {"input": base64.b64encode(d).decode(), "error": True, "why": type(e).__name__}
        out.append(case)
    return out


# Times: isoformat() of aware datetimes, and strings Python's datetime
# parses (3.11 fromisoformat; Celery 5.3+ uses dateutil's isoparse, 5.2 its
# own parser, both at least as lenient for these forms).
def time_cases():
    dts = [
        dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
        dt.datetime(2026, 11, 29, 18, 49, 39, 713054, tzinfo=IST),
        dt.datetime(1, 1, 1, 0, 0, tzinfo=UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=PST),
        dt.datetime(2024, 2, 29, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30))),
        dt.datetime(2024, 6, 1, 0, 0, 0, 100000, tzinfo=dt.timezone(dt.timedelta(hours=14))),
        dt.datetime(2024, 6, 1, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=1, seconds=15))),
        dt.datetime(999, 3, 4, 5, 6, 7, tzinfo=UTC),
    ]
    fmt = [{"value": tag(d), "iso": d.isoformat()} for d in dts]
    strings = [
        "2024-01-02T03:04:05+00:00", "2024-01-02T03:04:05.123456+05:30", "2024-01-02T03:04:05Z",
        "2024-01-02T03:04:05z", "2024-01-02T03:04:05+0530", "2024-01-02T03:04:05-08", "2024-01-02 03:04:05",
        "2024-01-02T03:04", "2024-01-02", "2024-01-02T03:04:05.5", "2024-01-02T03:04:05,25",
        "2024-01-02T03:04:05.123", "2024-01-02t03:04:05", "2024-01-02T03:04:05+05:30:15",
        "2026-11-29T18:49:39.713054+05:30", "2030-01-01T12:00:00", "2024-02-29T00:00:00-00:00",
        "2023-02-29T00:00:00", "2024-13-01T00:00:00", "2024-01-32T00:00:00", "2024-01-02T24:00:00",
        "2024-01-02T23:60:00", "2024-01-02T23:59:60", "2024-01-02T03:04:05+24:00", "2024-01-02T03:04:05+05:60",
        "2024-1-2T03:04:05", "24-01-02T03:04:05", "2024-01-02T3:04:05", "2024-01-02T03:04:05.",
        "2024-01-02T03:04:05+5", "2024-01-02T03:04:05 +05:00", "", "now", "2024-01-02T03:04:05.1234567890",
        "0000-01-01T00:00:00",
    ]
    parse = []
    for s in strings:
        try:
            d = dt.datetime.fromisoformat(s)
            parse.append({"input": s, "value": tag(d)})
        except ValueError:
            parse.append({"input": s, "error": True})
    return fmt, parse


def args_cases():
    argss = [
        [], [2], [2, 3], ["a\nb", "it's", 'x"y'], [[[[1]]]], [{"a": [1, {"b": [2]}]}],
        [1.0, 1e16, True, None, float("nan")], [b"ab\x00", b"\xff"], ["a" * 2000], list(range(500)),
        ["hello world foo bar"], [{"k": "v" * 30, "j": [1, 2, 3]}], [dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)],
        [decimal.Decimal("1.5"), UID, dt.date(2024, 1, 2), dt.time(1, 2)],
        [dt.datetime(2024, 1, 2, 3, 4, tzinfo=PST), dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=IST)],
        [10**30, -2**63, 0.1, -0.0], ["x" * 1100, "tail"], [[1, 2], [3, [4, [5]]]],
    ]
    out = []
    for a in argss:
        a = sort_dicts(a)
        out.append({"args": tag(a), "saferepr": {str(n): saferepr(tuple(a), n) for n in (None, 1024, 30, 10, 4, 1)},
                    "repr": repr(tuple(a))})
    return out


def compressed_cases():
    """Bodies compressed as kombu does (zlib.compress for application/x-gzip,
    bz2.compress for application/x-bz2), plus a real gzip stream."""
    bodies = [b"", json.dumps(typical_body()).encode(), json.dumps(nested_body()).encode() * 20]
    out = []
    for b in bodies:
        out.append({"plain": base64.b64encode(b).decode(),
                    "zlib": base64.b64encode(zlib.compress(b)).decode(),
                    "bz2": base64.b64encode(bz2.compress(b)).decode(),
                    "gzip": base64.b64encode(gzip.compress(b, mtime=0)).decode()})
    return out


def main():
    fmt, parse = time_cases()
    doc = {
        "generator": "protocol/testdata/gen_values.py",
        "python": sys.version.split()[0],
        "msgpack": ".".join(map(str, msgpack.version)),
        "values": [value_case(n, o) for n, o in VALUES],
        "json_inputs": [json_input_case(s) for s in JSON_INPUTS],
        "msgpack_inputs": msgpack_inputs(),
        "time_format": fmt,
        "time_parse": parse,
        "args": args_cases(),
        "compressed": compressed_cases(),
    }
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=True)
        f.write("\n")


if __name__ == "__main__":
    main()
