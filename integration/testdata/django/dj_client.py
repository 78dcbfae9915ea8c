"""Python side of integration/sqlbackend_django_test.go: the Django project
sends tasks to a celeriac worker through django-celery-results
(result_backend = "django-db") and reads them back with AsyncResult, the
ORM and the admin. Run with /usr/bin/python3 from this directory (or with
it on PYTHONPATH); DJANGO_DB, BROKER and QUEUE as in djproj/settings.py.
Prints one JSON line per step."""
import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")

import django  # noqa: E402

django.setup()

from celery import chord  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django_celery_results.models import ChordCounter, TaskResult  # noqa: E402

from djproj.celery import add, app, fail, tsum  # noqa: E402


def emit(**kw):
    print(json.dumps(kw, default=str), flush=True)


def migrate():
    import celery
    import django_celery_results
    call_command("migrate", verbosity=0)
    emit(migrated=True, celery=celery.__version__, django=django.get_version(),
         django_celery_results=django_celery_results.__version__)


def row(task_id):
    r = TaskResult.objects.get(task_id=task_id)
    return dict(status=r.status, result=r.result, worker=r.worker, task_name=r.task_name,
                task_args=r.task_args, task_kwargs=r.task_kwargs, content_type=r.content_type,
                date_done=r.date_done.isoformat(), traceback=r.traceback, meta=r.meta)


def client(steps="get,failure,admin"):
    steps = steps.split(",")
    if "get" in steps:
        r = add.delay(2, 3)
        emit(step="get", value=r.get(timeout=60), state=r.state, row=row(r.id), id=r.id)
    if "failure" in steps:
        r = fail.delay("bad thing")
        exc = r.get(timeout=60, propagate=False)
        emit(step="failure", state=r.state, result=[type(exc).__name__, list(exc.args)],
             traceback=r.traceback, row=row(r.id))
    if "chord" in steps:
        body_queue = os.environ.get("BODY_QUEUE")
        body = tsum.s().set(queue=body_queue) if body_queue else tsum.s()
        r = chord([add.s(i, i) for i in range(20)])(body)
        emit(step="chord", value=r.get(timeout=120), state=r.state, id=r.id,
             counters=ChordCounter.objects.count())
    if "admin" in steps:
        ids = list(TaskResult.objects.values_list("task_id", flat=True))
        User.objects.filter(username="it-admin").delete()
        user = User.objects.create_superuser("it-admin", "it@example.com", "it-password")
        c = Client()
        c.force_login(user)
        resp = c.get("/admin/django_celery_results/taskresult/")
        page = resp.content.decode()
        emit(step="admin", status=resp.status_code, listed=sorted(i for i in ids if i in page), ids=sorted(ids))
    app.close()


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])


def beat_put(name, task, queue, every, args="[]"):
    """Creates or edits a periodic task as Django's admin would save it."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask
    iv, _ = IntervalSchedule.objects.get_or_create(every=int(every), period=IntervalSchedule.SECONDS)
    t, created = PeriodicTask.objects.update_or_create(
        name=name, defaults=dict(task=task, interval=iv, queue=queue, args=args))
    emit(id=t.id, created=created)


def beat_row(name):
    from django_celery_beat.models import PeriodicTask
    t = PeriodicTask.objects.get(name=name)
    emit(last_run_at=t.last_run_at.isoformat() if t.last_run_at else None,
         total_run_count=t.total_run_count, every=t.interval.every)


def beat_send(name):
    """Sends one run of the task as DatabaseScheduler does when it is due."""
    from django_celery_beat.models import PeriodicTask
    from django_celery_beat.schedulers import DatabaseScheduler, ModelEntry
    s = DatabaseScheduler(app=app, lazy=True)
    s.apply_async(ModelEntry(PeriodicTask.objects.get(name=name), app=app), producer=s.producer, advance=False)
    emit(sent=name)
