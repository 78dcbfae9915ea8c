"""The project's Celery app, configured from Django's settings (CELERY_*)."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")

app = Celery("djproj")
app.config_from_object("django.conf:settings", namespace="CELERY")


@app.task(name="it_dj.add")
def add(x, y):
    return x + y


@app.task(name="it_dj.tsum")
def tsum(xs):
    return sum(xs)


@app.task(name="it_dj.fail")
def fail(msg):
    raise ValueError(msg, 42)
