"""A minimal Django project using django-celery-results, the way a Django
shop configures it: result_backend = "django-db".

DJANGO_DB is the PostgreSQL URL (postgres://user:pass@host:port/db); an
optional ?search_path=schema puts every table in that schema, so that
tests do not share tables. BROKER is the Celery broker URL."""
import os
from urllib.parse import parse_qs, urlparse

_db = urlparse(os.environ.get("DJANGO_DB", "postgres://celeriac:celeriac@127.0.0.1:5432/celeriac"))
_q = parse_qs(_db.query)

SECRET_KEY = "celeriac-integration-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_celery_results",
]
if os.environ.get("DJANGO_BEAT"):  # django-celery-beat's tables (celeriac beat's tests)
    INSTALLED_APPS.append("django_celery_beat")
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "djproj.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]

DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": _db.path.lstrip("/"),
    "USER": _db.username or "",
    "PASSWORD": _db.password or "",
    "HOST": _db.hostname or "127.0.0.1",
    "PORT": str(_db.port or 5432),
}}
if "search_path" in _q:
    DATABASES["default"]["OPTIONS"] = {"options": "-c search_path=" + _q["search_path"][0]}

CELERY_BROKER_URL = os.environ.get("BROKER", "memory://")
CELERY_RESULT_BACKEND = "django-db"
CELERY_RESULT_EXTENDED = True
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("QUEUE", "celery")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = False
