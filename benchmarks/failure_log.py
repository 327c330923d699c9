"""pytest plugin: append each failing test and its error to $FAILURE_LOG as soon as it fails.

A GPU test run that hits its time limit never prints pytest's summary; with
`-p benchmarks.failure_log` the failures seen so far are already on disk.
"""

import os


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("FAILURE_LOG")
    # pytest-xdist reports each failure in the worker and again in the controller: log once.
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    with open(path, "a") as log:
        log.write(f"FAILED {report.nodeid} ({report.when})\n")
        if crash is not None:  # the assertion line, before pytest's (long) explanation
            log.write(f"{crash.path}:{crash.lineno}: {crash.message[:600]}\n")
        log.write(str(report.longrepr)[-1500:] + "\n\n")
