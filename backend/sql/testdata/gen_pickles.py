#!/usr/bin/python3
"""Regenerate backend/sql/testdata/pickle_values.json, the golden pickles
for DecodePickle (unpickle_test.go).

Run from the repository root with Debian's interpreter, which has Celery:

    /usr/bin/python3 backend/sql/testdata/gen_pickles.py

Each case is a pickle Python itself writes (pickle.dumps of a value, with
protocols 0 to 5; Celery's SQLAlchemy backend stores PickleType, which
pickles with the highest protocol), and what Go must decode from it,
computed here from the value:

    ["none"] ["bool", b] ["int", "<digits>"] ["float", "<hex of the double>"]
    ["str", s] ["bytes", "<hex>"] ["list", [...]] (list, tuple, set, frozenset)
    ["dict", [[key, value], ...]] (keys made text as json.dumps makes them,
    sorted) ["datetime", [y, mo, d, h, mi, s, us, utc_offset_seconds]]
    ["date", [y, mo, d]] ["time", [h, mi, s, us]] ["decimal", "<str>"]
    ["uuid", "<hex>"]

or the error Go must return: "unsafe" (errors.Is ErrUnsafePickle), "deep"
(errors.Is protocol.ErrTooDeep) or "error" (any other). The pickles of
the error cases are never loaded here; those written by hand could run
code if they were.

Set iteration order depends on string hashing, so the script runs itself
with PYTHONHASHSEED=0 to write the same file every time.
"""

import collections
import datetime as dt
import decimal
import json
import math
import os
import pickle
import struct
import sys
import uuid
import zoneinfo

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

from celery import Celery  # noqa: E402
from celery.backends.base import BaseBackend  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pickle_values.json")


def fffd(s):
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in s)


def key_text(k):
    """The text json.dumps makes of a dict key."""
    return next(iter(json.loads(json.dumps({k: None}))))


def tagged(v):
    if v is None:
        return ["none"]
    if isinstance(v, bool):
        return ["bool", v]
    if isinstance(v, int):
        return ["int", str(v)]
    if isinstance(v, float):
        return ["float", struct.pack(">d", v).hex()]
    if isinstance(v, str):
        return ["str", fffd(v)]
    if isinstance(v, (bytes, bytearray)):
        return ["bytes", bytes(v).hex()]
    if isinstance(v, (list, tuple, set, frozenset)):
        return ["list", [tagged(x) for x in v]]
    if isinstance(v, dict):
        items = {}
        for k, x in v.items():
            items[key_text(k)] = tagged(x)
        return ["dict", [[k, items[k]] for k in sorted(items)]]
    if isinstance(v, dt.datetime):
        off = v.utcoffset()
        off = 0 if off is None else int(off.total_seconds())
        return ["datetime", [v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, off]]
    if isinstance(v, dt.date):
        return ["date", [v.year, v.month, v.day]]
    if isinstance(v, dt.time):
        return ["time", [v.hour, v.minute, v.second, v.microsecond]]
    if isinstance(v, decimal.Decimal):
        return ["decimal", str(v)]
    if isinstance(v, uuid.UUID):
        return ["uuid", v.hex]
    raise TypeError(type(v))


class Thing:
    def __init__(self):
        self.x = 1


def celery_exception(exc):
    """The dict Celery's backends store for an exception with the json
    result_serializer (the default), as DatabaseBackend pickles it."""
    return BaseBackend(app=Celery(set_as_current=False)).prepare_exception(exc)


def values():
    shared = [1, "two"]
    return [
        ("none", None), ("true", True), ("false", False),
        ("zero", 0), ("one", 1), ("neg1", -1), ("255", 255), ("256", 256), ("65535", 65535), ("65536", 65536),
        ("int32max", 2**31 - 1), ("int32min", -(2**31)), ("int32max+1", 2**31), ("int32min-1", -(2**31) - 1),
        ("int64max", 2**63 - 1), ("int64min", -(2**63)), ("int64max+1", 2**63), ("int64min-1", -(2**63) - 1),
        ("2^64", 2**64), ("10^40", 10**40), ("-10^40", -(10**40)), ("2^1000", 2**1000), ("-2^3000", -(2**3000)),
        ("-128", -128), ("-129", -129), ("-256", -256),
        ("float", 1.5), ("float0", 0.0), ("negzero", -0.0), ("tenth", 0.1), ("huge", 1e300), ("tiny", 5e-324),
        ("inf", math.inf), ("-inf", -math.inf), ("nan", math.nan),
        ("emptystr", ""), ("str", "héllo ✓ 日本"), ("astral", "\U0001F600"), ("escapes", "a\\b\n\r\x1a\x00\t'\""),
        ("backslash-u", "\\u0041 \\\\u0041"), ("latin1", "\xe9\xff\x80"), ("longstr", "x" * 300),
        ("surrogate", "a\ud800b"), ("surrogates", "\ud83d\ude00"),
        ("emptybytes", b""), ("bytes", b"\x00\xff"), ("allbytes", bytes(range(256))), ("longbytes", b"y" * 300),
        ("bytearray", bytearray(b"ab\x00")), ("emptybytearray", bytearray()),
        ("emptylist", []), ("list", [1, "a", None, 2.5]), ("nested", [[[]], [[1]]]), ("list1001", list(range(1001))),
        ("emptytuple", ()), ("tuple1", (1,)), ("tuple2", (1, "b")), ("tuple3", (1, 2, 3)), ("tuple4", (1, 2, 3, 4)),
        ("tuples", ((), ((1,),), [()])),
        ("emptydict", {}), ("dict", {"a": 1, "b": [True, None], "": "empty key"}),
        ("dict1001", {str(i): i for i in range(1001)}),
        ("keys", {1: "int", -5: "neg", 10**30: "big", None: "none", False: "false", 2.5: "float",
                  math.inf: "inf", -math.inf: "-inf", 1e16: "1e16", "s": "str"}),
        ("keyclash", {1: "int first", "1": "str last"}),
        ("set", {1, 2, 3}), ("strset", {"a", "b", "c"}), ("emptyset", set()), ("frozenset", frozenset({"x", 2})),
        ("emptyfrozenset", frozenset()),
        ("shared", [shared, shared, {"a": shared}]),
        ("naive", dt.datetime(2026, 11, 29, 13, 13, 55, 990025)), ("naive-whole", dt.datetime(2026, 1, 2, 3, 4, 5)),
        ("utc", dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc)),
        ("ist", dt.datetime(2000, 2, 29, 0, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))),
        ("pst", dt.datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=dt.timezone(dt.timedelta(hours=-8)))),
        ("named-tz", dt.datetime(2024, 6, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=2), "CEST"))),
        ("fold", dt.datetime(2024, 10, 27, 2, 30, fold=1)),
        ("min-datetime", dt.datetime.min), ("max-datetime", dt.datetime.max),
        ("date", dt.date(2024, 2, 29)), ("min-date", dt.date.min), ("max-date", dt.date.max),
        ("time", dt.time(23, 59, 59, 999999)), ("midnight", dt.time(0, 0)),
        ("utc-time", dt.time(1, 2, 3, 4, tzinfo=dt.timezone.utc)), ("fold-time", dt.time(1, 30, fold=1)),
        ("decimal", decimal.Decimal("-12.50")), ("decimal-nan", decimal.Decimal("NaN")),
        ("decimal-inf", decimal.Decimal("-Infinity")), ("decimal-exp", decimal.Decimal("1E+3")),
        ("decimal-snan", decimal.Decimal("sNaN12")),
        ("uuid", uuid.UUID("12345678-1234-5678-1234-567812345678")),
        ("uuid-safe", uuid.UUID("12345678-1234-5678-1234-567812345678", is_safe=uuid.SafeUUID.safe)),
        ("uuid-unsafe", uuid.UUID("00000000-0000-0000-0000-000000000001", is_safe=uuid.SafeUUID.unsafe)),
        ("uuid-zero", uuid.UUID(int=0)), ("uuid-max", uuid.UUID(int=2**128 - 1)),
        ("celery-exception", celery_exception(ValueError("bad thing", 42))),
        ("celery-exception-noargs", celery_exception(KeyError())),
        ("started", {"pid": 8789, "hostname": "w1@testhost"}),
        ("mixed", {"rows": [{"id": 1, "when": dt.datetime(2026, 5, 4, 3, 2, 1), "amount": decimal.Decimal("9.99"),
                             "tags": ("a", "b"), "ref": uuid.UUID(int=7)}], "ok": True, "total": 2**70}),
    ]


def unsafe_values():
    """Values whose pickles import or call something DecodePickle must
    refuse; they are pickled by Python but never loaded."""
    return [
        ("exception", ValueError("bad", 42)),
        ("ordereddict", collections.OrderedDict([("a", 1)])),
        ("complex", complex(1, 2)),
        ("instance", Thing()),
        ("zoneinfo", dt.datetime(2024, 6, 1, 12, 0, tzinfo=paris_zone())),
        ("range", range(3)),
        ("function", len),
    ]


def paris_zone():
    return zoneinfo.ZoneInfo("Europe/Paris")


def error_values():
    """Values of allow-listed classes that have no protocol value, and
    structures DecodePickle refuses."""
    rec = []
    rec.append(rec)
    drec = {}
    drec["self"] = drec
    return [
        ("timedelta", dt.timedelta(days=1), "error"),
        ("timezone", dt.timezone.utc, "error"),
        ("class", dt.datetime, "error"),
        ("tuple-key", {(1, 2): 3}, "error"),
        ("bytes-key", {b"k": 1}, "error"),
        ("offset-time", dt.time(1, 2, tzinfo=dt.timezone(dt.timedelta(hours=1))), "error"),
        ("recursive-list", rec, "deep"),
        ("recursive-dict", drec, "deep"),
    ]


# Pickles written by hand: what an attacker would store. Never loaded.
HANDWRITTEN = [
    ("os-system", b"cos\nsystem\n(S'echo pwned'\ntR.", "unsafe"),
    ("stack-global-eval", b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c\x041+1\x85R.", "unsafe"),
    ("builtins-getattr", b"\x80\x02cbuiltins\ngetattr\n.", "unsafe"),
    ("dotted-name", b"\x80\x04\x8c\x08datetime\x8c\x16datetime.fromtimestamp\x93K\x00\x85R.", "unsafe"),
    ("inst", b"(i__main__\nThing\n.", "unsafe"),
    ("obj", b"(c__main__\nThing\no.", "unsafe"),
    ("ext1", b"\x80\x02\x82\x01.", "unsafe"),
    ("persid", b"P123\n.", "unsafe"),
    ("binpersid", b"\x80\x02K\x01Q.", "unsafe"),
    ("newobj-ex", b"\x80\x04\x8c\x04uuid\x8c\x04UUID\x93)}\x92.", "unsafe"),
    ("build-on-list", b"\x80\x02]}b.", "unsafe"),
    ("reduce-non-global", b"\x80\x02K\x01)R.", "unsafe"),
    ("datetime-call-ints", b"\x80\x02cdatetime\ndatetime\nM\xe8\x07K\x01K\x01\x87R.", "error"),
    ("next-buffer", b"\x80\x05\x97\x98.", "error"),
    ("bad-month", b"\x80\x03cdatetime\ndate\nC\x04\x07\xe8\x0d\x01\x85R.", "error"),
    ("feb-30", b"\x80\x03cdatetime\ndate\nC\x04\x07\xe8\x02\x1e\x85R.", "error"),
    ("truncated", b"\x80\x05\x8c\x05ab", "error"),
    ("no-stop", b"\x80\x02K\x01", "error"),
    ("empty", b"", "error"),
    ("bad-opcode", b"\x80\x02\xff.", "error"),
    ("protocol-6", b"\x80\x06N.", "error"),
    ("underflow", b"\x80\x02\x85.", "error"),
    ("no-mark", b"\x80\x02]e.", "error"),
    ("get-missing", b"\x80\x02h\x05.", "error"),
    ("odd-setitems", b"\x80\x02}(K\x01u.", "error"),
    ("py2-non-ascii", b"U\x02\xc3\xa9.", "error"),
    ("bad-utf8", b"X\x01\x00\x00\x00\xff.", "error"),
]


def main():
    cases = []
    for name, v in values():
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            p = pickle.dumps(v, proto)
            back = pickle.loads(p)
            assert tagged(back) == tagged(v) or v != v, name
            cases.append({"name": f"{name}/p{proto}", "pickle": p.hex(), "want": tagged(v)})
    for name, v in unsafe_values():
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            cases.append({"name": f"unsafe-{name}/p{proto}", "pickle": pickle.dumps(v, proto).hex(), "error": "unsafe"})
    for name, v, kind in error_values():
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            cases.append({"name": f"{name}/p{proto}", "pickle": pickle.dumps(v, proto).hex(), "error": kind})
    for name, p, kind in HANDWRITTEN:
        cases.append({"name": name, "pickle": p.hex(), "error": kind})
    head = {"generator": "backend/sql/testdata/gen_pickles.py", "python": sys.version.split()[0]}
    with open(OUT, "w") as f:
        # One case a line, so that a regenerated file diffs by case.
        f.write(json.dumps(head)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c, sort_keys=True) for c in cases))
        f.write("\n]}\n")
    print(f"{OUT}: {len(cases)} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
