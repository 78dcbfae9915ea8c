#!/usr/bin/env python3
"""Django's command-line utility for the test project of
integration/sqlbackend_django_test.go (run with /usr/bin/python3)."""
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djproj.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
