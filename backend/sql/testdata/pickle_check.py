"""Reads hex pickles written by celeriac's encoder (one per line) and
prints, per line, a canonical JSON of what pickle.loads returns, so the Go
test compares values (types included) rather than bytes.

Run by backend/sql's TestPickleLoadsInPython. The pickles come from the
test itself; this script is the only place where they are unpickled."""
import datetime
import decimal
import json
import pickle
import struct
import sys


def canon(v):
    if v is None or isinstance(v, bool) or isinstance(v, str):
        return v
    if isinstance(v, int):
        return {"int": str(v)}
    if isinstance(v, float):
        return {"float": struct.pack(">d", v).hex()}
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, list):
        return [canon(x) for x in v]
    if isinstance(v, tuple):
        return {"tuple": [canon(x) for x in v]}
    if isinstance(v, dict):
        return {"dict": [[canon(k), canon(x)] for k, x in sorted(v.items())]}
    if isinstance(v, datetime.datetime):
        return {"datetime": v.isoformat()}
    if isinstance(v, datetime.date):
        return {"date": v.isoformat()}
    if isinstance(v, datetime.time):
        return {"time": v.isoformat()}
    if isinstance(v, decimal.Decimal):
        return {"decimal": str(v)}
    return {"unexpected": repr(type(v))}


for line in sys.stdin:
    line = line.strip()
    try:
        out = canon(pickle.loads(bytes.fromhex(line)))
    except Exception as e:  # reported, never fatal: the Go test fails on it
        out = {"error": repr(e)}
    print(json.dumps(out, sort_keys=True))
