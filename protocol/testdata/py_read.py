#!/usr/bin/python3
"""Decode what celeriac wrote, the way Python does, for
python_read_test.go (TestPythonReadsEncodings).

stdin:  a JSON list of {"kind": K, "data": "<base64>"}, where K is
        json_plain (kombu 5.2's json.loads), json_typed (kombu 5.3's
        object hook), msgpack (msgpack.unpackb(raw=False)) or zlib_json
        (zlib.decompress, then the kombu 5.3 reader).
stdout: a JSON list of {"value": <tagged value>} or {"error": "<repr>"},
        in the tagged form of gen_values.py.
"""

import base64
import json
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import msgpack  # noqa: E402
from kombu.utils import json as kombu52_json  # noqa: E402

from gen_values import loads53, tag  # noqa: E402

READERS = {
    "json_plain": lambda b: kombu52_json.loads(b),
    "json_typed": lambda b: loads53(b.decode("utf-8")),
    "msgpack": lambda b: msgpack.unpackb(b, raw=False),
    "zlib_json": lambda b: loads53(zlib.decompress(b).decode("utf-8")),
}


def main():
    out = []
    for case in json.load(sys.stdin):
        data = base64.b64decode(case["data"])
        try:
            out.append({"value": tag(READERS[case["kind"]](data))})
        except Exception as e:  # noqa: BLE001 - report any refusal
            out.append({"error": repr(e)})
    json.dump(out, sys.stdout, ensure_ascii=True)


if __name__ == "__main__":
    main()
