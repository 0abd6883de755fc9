"""The report and viewer tests' fixtures; their helpers live in report_support.py (imported by name)."""

from report_support import chain, demo, demo_deployment, key, key_file  # noqa: F401  (fixtures)
