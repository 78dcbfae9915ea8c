"""Python side of the differential canvas tester (canvas_diff_test.go).

A long-lived process: each stdin line is {"canvas": node, "run": id,
"queues": [q1, q2], "timeout": seconds}, a node being
{"t": "task"|"fail", "k": n, "imm": bool, "q": 0|1, "tag": s, "link": node,
"err": node} | {"t": "chain"|"group", "c": [...]} |
{"t": "chord", "c": [...], "b": node, "err": node} | {"t": "err", "tag": s}.
It is built with Celery's own signature/chain/group/chord, applied, and
its result (or its error's type) written as one JSON line; for a group
whose get() timed out only because of celery/celery#6734, "stranded" says
what it would have returned (see stranded()).
"""
import json
import sys

from celery import chain, chord, group, states
from celery.exceptions import TimeoutError as CeleryTimeout
from celery.result import GroupResult

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


def stranded(r):
    """After a GroupResult.get that timed out: what get() would have
    returned had it not been for celery/celery#6734, else None.

    group._apply_tasks (canvas.py 1203-1214 in 5.2.6) applies each member,
    then registers the member's frozen result with the result consumer
    (res.then(p, weak=True)). When a member is a chord whose body is a
    chain, or ends in one (Celery's chain() folds the steps after a chord
    into its body), applying it leaves a second AsyncResult with the
    member's id on the signature: chord.run's body.freeze (canvas.py 1498)
    is chain.freeze, which keeps it in the body chain's _frozen (683).
    When the signature is freed, as group.apply_async's list() of
    _apply_tasks ends (1096), that AsyncResult's __del__ (result.py 389)
    calls backend.remove_pending_result, which removes by id, not by
    object (backends/asynchronous.py 206-216): the member is no longer
    pending and its channel is unsubscribed, so its result is never heard
    (or, already stored, sits in _pending_messages) and the group's
    barrier never fills.

    The mark of it: a member neither fulfilled nor pending. join_native
    raises the first failure to arrive, so get() would have raised one of
    the dropped members' failures if any is stored as failed, else
    returned once every member is ready. A member that never finished and
    no failure to raise is a real hang: None.
    """
    if not isinstance(r, GroupResult):
        return None
    be = r.backend
    pending = set()
    for m in be._pending_results:
        pending.update(m.keys())
    metas, failed, dropped = [], [], False
    for m in r.results:
        meta = be.get_task_meta(m.id)
        metas.append(meta)
        if m._cache or m.id in pending:
            continue
        dropped = True
        if meta["status"] in states.PROPAGATE_STATES:
            failed.append(type(meta["result"]).__name__)
    if not dropped:
        return None
    if failed:
        return {"errors": failed}
    if all(x["status"] in states.READY_STATES for x in metas):
        return {"result": [x["result"] for x in metas]}
    return None


for line in sys.stdin:
    req = json.loads(line)
    r = None
    try:
        r = build(req["canvas"], req["run"], req["queues"]).apply_async()
        out = {"result": r.get(timeout=req.get("timeout", 20), disable_sync_subtasks=False)}
    except CeleryTimeout:
        out = {"error_type": "TIMEOUT", "stranded": stranded(r)}
    except Exception as e:  # reported, compared: never hidden
        out = {"error_type": type(e).__name__, "error": str(e)[:300]}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
