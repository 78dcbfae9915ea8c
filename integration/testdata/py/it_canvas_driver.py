"""Python side of the differential canvas tester (canvas_diff_test.go).

A long-lived process: each stdin line is {"canvas": node, "run": id,
"queues": [q1, q2], "timeout": seconds}, a node being
{"t": "task"|"fail", "k": n, "imm": bool, "q": 0|1, "tag": s, "link": node,
"err": node} | {"t": "chain"|"group", "c": [...]} |
{"t": "chord", "c": [...], "b": node, "err": node} | {"t": "err", "tag": s}.
It is built with Celery's own signature/chain/group/chord, applied, and
its result (or its error's type) written as one JSON line.
"""
import json
import sys

from celery import chain, chord, group
from celery.exceptions import TimeoutError as CeleryTimeout

from it_client_app import app

NAMES = {"task": "tasks.cd_sum", "fail": "tasks.cd_fail", "err": "tasks.cd_err"}


def build(n, run, queues):
    t = n["t"]
    if t in NAMES:
        args = (n.get("k", 0),) if t != "err" else ()
        s = app.signature(NAMES[t], args=args, kwargs={"tag": n["tag"], "run": run})
        if n.get("imm") or t == "err":
            s = s.set(immutable=True)
        if n.get("q"):
            s = s.set(queue=queues[n["q"]])
    elif t == "chain":
        s = chain(*[build(c, run, queues) for c in n["c"]])
    elif t == "group":
        s = group(*[build(c, run, queues) for c in n["c"]])
    elif t == "chord":
        s = chord([build(c, run, queues) for c in n["c"]], build(n["b"], run, queues))
    else:
        raise ValueError(t)
    if n.get("link"):
        s.link(build(n["link"], run, queues))
    if n.get("err"):
        s.link_error(build(n["err"], run, queues))
    return s


for line in sys.stdin:
    req = json.loads(line)
    try:
        r = build(req["canvas"], req["run"], req["queues"]).apply_async()
        out = {"result": r.get(timeout=req.get("timeout", 20), disable_sync_subtasks=False)}
    except CeleryTimeout:
        out = {"error_type": "TIMEOUT"}
    except Exception as e:  # reported, compared: never hidden
        out = {"error_type": type(e).__name__, "error": str(e)[:300]}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
