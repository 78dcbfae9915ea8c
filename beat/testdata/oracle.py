"""Celery's schedules as the oracle for celeriac's beat package.

Reads one JSON case a line on stdin, writes one JSON answer a line on
stdout, in one long-lived process. A case:
  {"kind": "cron", "spec": [minute, hour, day_of_week, day_of_month,
   month_of_year], "tz": "Europe/Berlin", "last": µs since the epoch,
   "now": µs since the epoch, "deadline": seconds or null}
  {"kind": "interval", "every": µs, "relative": bool, ...}
  {"kind": "solar", "event": "sunrise", "lat": 52.5, "lon": 13.4, ...}
last and now are instants; as beat does (app.now()), they are localized
into the app's time zone before the schedule sees them. An answer:
  {"rem": µs, "due": bool, "next": seconds as float} or {"err": "..."}.
"""
import json
import sys
from datetime import datetime, timedelta, timezone as dt_timezone

import celery
from celery import Celery
from celery.schedules import crontab, schedule, solar
from celery.utils.time import timezone as celery_tz

app = Celery("oracle", set_as_current=True)
EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
zones = {}


def instant(us, tz):
    return (EPOCH + timedelta(microseconds=us)).astimezone(tz)


def us(td):
    return (td.days * 86400 + td.seconds) * 10**6 + td.microseconds


def answer(case):
    tz = zones.get(case["tz"])
    if tz is None:
        tz = zones[case["tz"]] = celery_tz.get_timezone(case["tz"])
    last = instant(case["last"], tz)
    now = instant(case["now"], tz)
    app.conf.beat_cron_starting_deadline = case.get("deadline")
    kind = case["kind"]
    if kind == "cron":
        m, h, dow, dom, moy = case["spec"]
        s = crontab(minute=m, hour=h, day_of_week=dow, day_of_month=dom,
                    month_of_year=moy, nowfun=lambda: now, app=app)
    elif kind == "interval":
        s = schedule(timedelta(microseconds=case["every"]), case.get("relative", False),
                     nowfun=lambda: now, app=app)
    else:
        s = solar(case["event"], case["lat"], case["lon"], nowfun=lambda: now, app=app)
    s.tz = tz
    s.utc_enabled = True
    rem = s.remaining_estimate(last)
    due, nxt = s.is_due(last)
    return {"rem": us(rem), "due": bool(due), "next": nxt}


print(json.dumps({"celery": celery.__version__}), flush=True)
for line in sys.stdin:
    case = json.loads(line)
    try:
        out = answer(case)
    except Exception as e:  # the Go side must refuse or fail the same case
        out = {"err": "%s: %s" % (type(e).__name__, e)}
    sys.stdout.write(json.dumps(out) + "\n")
sys.stdout.flush()
