#!/usr/bin/python3
"""Write decisions.json: what Celery decides when a task fails.

Run with Debian's interpreter, which has python3-celery installed:

    /usr/bin/python3 retry/testdata/gen_decisions.py > retry/testdata/decisions.json

Each case builds a real Celery task with the given options, pushes a worker
request (called_directly=False, the given retries count) and runs the task's
`run`, which goes through Celery's own autoretry wrapper and Task.retry. The
retry message is published to an in-memory broker. The outcome is what Celery
raised: Retry (with its `when`: the countdown in seconds, or the eta) or the
exception the task fails with. The Go test (TestDecideMatchesCelery) replays
every case through Policy.Decide.

Exceptions: ValueError plays the error listed in autoretry_for, TypeError an
error that is not listed. dont_autoretry_for is not covered here: Celery 5.2.6
predates it (it came in 5.3), so the Go tests cover it by table.
"""
import datetime
import json
import sys

import celery
import celery.utils.time
from celery import Celery
from celery.exceptions import Retry

NOW = datetime.datetime(2026, 11, 29, 12, 0, 0, tzinfo=datetime.timezone.utc)
ETA = NOW + datetime.timedelta(seconds=90)


class TopDraw:
    """Stands in for the random module: always the largest draw."""

    @staticmethod
    def randrange(n):
        return n - 1


POLICIES = {
    # name: task options (Celery's names)
    "defaults": {},
    "auto": {"autoretry_for": (ValueError,)},
    "auto_max1": {"autoretry_for": (ValueError,), "max_retries": 1},
    "auto_max0": {"autoretry_for": (ValueError,), "max_retries": 0},
    "auto_unlimited": {"autoretry_for": (ValueError,), "max_retries": None},
    "auto_delay5": {"autoretry_for": (ValueError,), "default_retry_delay": 5},
    "auto_countdown7": {"autoretry_for": (ValueError,),
                        "retry_kwargs": {"countdown": 7}},
    "auto_backoff": {"autoretry_for": (ValueError,), "retry_backoff": True,
                     "retry_jitter": False},
    "auto_backoff3_max10": {"autoretry_for": (ValueError,), "retry_backoff": 3,
                            "retry_backoff_max": 10, "retry_jitter": False},
    "auto_backoff_countdown7": {"autoretry_for": (ValueError,),
                                "retry_backoff": 2, "retry_jitter": False,
                                "retry_kwargs": {"countdown": 7}},
    "auto_backoff_jitter_top": {"autoretry_for": (ValueError,),
                                "retry_backoff": True, "retry_backoff_max": 20},
}

# name: what the task body does, given the task (self) and a ValueError.
ACTIONS = {
    "raise_listed": lambda self, exc: (_ for _ in ()).throw(exc),
    "raise_unlisted": lambda self, exc: (_ for _ in ()).throw(TypeError("bad input")),
    "retry_exc": lambda self, exc: self.retry(exc=exc),
    "retry_noexc": lambda self, exc: self.retry(),
    "retry_countdown30": lambda self, exc: self.retry(exc=exc, countdown=30),
    "retry_countdown0": lambda self, exc: self.retry(exc=exc, countdown=0),
    "retry_eta": lambda self, exc: self.retry(exc=exc, eta=ETA),
    "retry_noexc_max5": lambda self, exc: self.retry(max_retries=5),
    "retry_exc_max1": lambda self, exc: self.retry(exc=exc, max_retries=1),
}

RETRIES = [0, 1, 2, 3, 7]


def run_case(app, policy, options, action, retries):
    name = "t.%s.%s.%d" % (policy, action, retries)
    body = ACTIONS[action]

    def fn(self, x, y, k=None):
        body(self, ValueError("flaky %d" % retries))

    task = app.task(bind=True, name=name, **options)(fn)
    task.push_request(id="id-%d" % retries, args=[1, "a"], kwargs={"k": None},
                      retries=retries, called_directly=False,
                      delivery_info={"exchange": "", "routing_key": "celery"})
    try:
        task.run(1, "a")
    except Retry as r:
        when = r.when
        out = {"retry": True}
        if isinstance(when, datetime.datetime):
            out["eta_offset"] = (when - NOW).total_seconds()
        else:
            out["countdown"] = when
        out["exc"] = None if r.exc is None else type(r.exc).__name__
        return name, out
    except Exception as e:  # the task's final exception
        return name, {"retry": False, "exc": type(e).__name__, "message": str(e)}
    finally:
        task.pop_request()
    return name, {"retry": False, "exc": None}


def main():
    app = Celery("t", broker="memory://", backend="cache+memory://")
    celery.utils.time.random = TopDraw()
    cases = []
    for policy, options in POLICIES.items():
        for action in ACTIONS:
            for retries in RETRIES:
                name, out = run_case(app, policy, options, action, retries)
                cases.append({"task": name, "policy": policy, "action": action,
                              "retries": retries, "outcome": out})
    head = json.dumps({"generator": "retry/testdata/gen_decisions.py",
                       "celery": celery.__version__})[:-1]
    body = ",\n  ".join(json.dumps(c, sort_keys=True) for c in cases)
    sys.stdout.write(head + ', "cases": [\n  ' + body + "\n]}\n")


if __name__ == "__main__":
    main()
