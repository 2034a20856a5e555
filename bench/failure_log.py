"""A pytest plugin for runs on a lent GPU (bench/gpu_check.sh): each failing test's report is
appended to the file FAILURE_LOG names as soon as the test ends, so a run stopped at its time
limit still returns every traceback it saw (pytest prints them only at the end).

    FAILURE_LOG=failures.txt python -m pytest -p tilefold.bench.failure_log ...
"""
from __future__ import annotations

import os

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("FAILURE_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:  # xdist's controller logs workers' reports
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
