"""`agent-runtime setup`: the offline model and data packages a plain `pip install .` leaves out.

`--check` reports each pinned package (installed here, since `make install` runs setup); a missing one is
installed with the pip flags its metadata needs (the pip call itself is the edge that is not run here: it
would download from the package index).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from agent_runtime import offline_packages
from agent_runtime.offline_packages import PACKAGES, OfflinePackage, setup


@pytest.mark.slow
def test_check_lists_every_pinned_package_as_installed():
    proc = subprocess.run(
        [sys.executable, "-m", "agent_runtime", "setup", "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for package in PACKAGES:
        assert package.requirement in proc.stdout
    assert proc.stdout.count("installed") == len(PACKAGES)


def test_missing_packages_are_installed_with_the_flags_their_metadata_needs(monkeypatch):
    absent = OfflinePackage("no-such-offline-package==1.0", "no_such_offline_package", "a test")
    odd = OfflinePackage("also-absent==2.0", "also_absent", "a test", ("--no-deps", "--ignore-requires-python"))
    monkeypatch.setattr(offline_packages, "PACKAGES", (PACKAGES[0], absent, odd))
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: calls.append(cmd))
    lines = []
    assert setup(model=False, out=lines.append) == 1, "still missing after the (not run) pip call"
    assert [c[3:] for c in calls] == [
        ["install", "--quiet", "--no-deps", "no-such-offline-package==1.0"],
        ["install", "--quiet", "--no-deps", "--ignore-requires-python", "also-absent==2.0"],
    ]
    assert any("no-such-offline-package==1.0" in line and "missing" in line for line in lines)
    assert setup(model=False, check=True, out=lines.append) == 1 and len(calls) == 2, "--check installs nothing"


def test_another_version_than_the_pin_counts_as_missing(monkeypatch):
    package = PACKAGES[0]
    pinned = OfflinePackage(package.requirement.split("==")[0] + "==0.0.1", package.module, "a test")
    assert package.status() == "installed" and pinned.status().startswith("version ")
