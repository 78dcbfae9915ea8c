"""Writes result rows with Python Celery's own DatabaseBackend (Celery 5.2,
SQLAlchemy, PickleType), for backend/sql's TestGetReadsPythonRows.

    /usr/bin/python3 store_rows.py <db+postgresql URL> <schema>

Each row's task id names what it holds; the Go test knows what Get must
return for each."""
import datetime
import decimal
import sys
import uuid

from celery import Celery
from celery.exceptions import TaskRevokedError


class Thing:
    """An application class: its pickle names __main__.Thing."""

    def __init__(self):
        self.x = 1


def app(url, schema, serializer):
    a = Celery("store_rows", set_as_current=False, backend=url)
    a.conf.database_table_schemas = {"task": schema, "group": schema}
    a.conf.result_serializer = serializer
    a.conf.accept_content = ["json", "pickle"]
    return a


def main(url, schema):
    be = app(url, schema, "json").backend
    be.store_result("py-success", {
        "n": 5, "big": 2**70, "when": datetime.datetime(2026, 1, 2, 3, 4, 5, 6),
        "aware": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=-5))),
        "day": datetime.date(2024, 2, 29), "amount": decimal.Decimal("1.10"), "id": uuid.UUID(int=5),
        "tags": ("a", "b"), "blob": b"\x00\xff", "set": frozenset({1}), "none": None, "f": 1.5,
    }, "SUCCESS")
    be.store_result("py-none", None, "SUCCESS")
    be.store_result("py-failure", ValueError("bad thing", 42), "FAILURE", traceback="Traceback (most recent call last):\nValueError")
    be.store_result("py-retry", KeyError("k"), "RETRY")
    be.mark_as_revoked("py-revoked", reason="revoked")
    be.mark_as_started("py-started", pid=4242, hostname="py@host")
    be.store_result("py-object", Thing(), "SUCCESS")
    # result_serializer = "pickle": Celery stores the exception itself.
    app(url, schema, "pickle").backend.store_result("py-pickled-exc", ValueError("pickled"), "FAILURE")


if __name__ == "__main__":
    main(*sys.argv[1:])
