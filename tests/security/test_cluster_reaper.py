"""The reaper on real processes: a stand-in driver starts a "cluster" (a process with a child of its own, as
the raylet starts its agents) and an unrelated child; the reaper follows the cluster only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from asyncrl.launch import cluster_reaper

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="the reaper reads Linux's /proc")

# The stand-in driver: a "cluster" root that starts a grandchild (reparented, not ended, when the root dies),
# and a bystander that is not part of the cluster. It prints the two pids.
DRIVER = """
import subprocess, sys, time
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
root = subprocess.Popen([sys.executable, "-c",
                         "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)", *sleeper])
bystander = subprocess.Popen(sleeper)
print(root.pid, bystander.pid, flush=True)
time.sleep(600)
"""


def is_alive(pid: int) -> bool:
    return cluster_reaper.start_time(pid) is not None


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


def start_driver_and_reaper():
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    root, bystander = map(int, driver.stdout.readline().split())
    assert wait_until(lambda: any(parent == root for parent, _ in cluster_reaper.parents().values()), 30)
    grandchild = next(pid for pid, (parent, _) in cluster_reaper.parents().items() if parent == root)
    reaper = subprocess.Popen(
        [sys.executable, "-I", cluster_reaper.__file__, str(driver.pid), str(cluster_reaper.start_time(driver.pid)),
         f"{root}:{cluster_reaper.start_time(root)}"], stdin=subprocess.PIPE, start_new_session=True)
    time.sleep(2 * cluster_reaper.POLL_S)  # one look at the tree below the root
    return driver, reaper, root, grandchild, bystander


def test_a_killed_driver_takes_its_cluster_and_what_the_cluster_started_with_it():
    driver, reaper, root, grandchild, bystander = start_driver_and_reaper()
    try:
        driver.kill()
        driver.wait()
        assert reaper.wait(timeout=10) == 0
        assert wait_until(lambda: not is_alive(root) and not is_alive(grandchild), 5)
    finally:
        for pid in (root, grandchild, bystander):
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_deliberate_shutdown_ends_the_clusters_leftovers_but_not_the_drivers_other_children():
    driver, reaper, root, grandchild, bystander = start_driver_and_reaper()
    try:
        reaper.stdin.close()
        assert reaper.wait(timeout=10) == 0
        assert wait_until(lambda: not is_alive(root) and not is_alive(grandchild), 5)
        assert is_alive(bystander) and driver.poll() is None
    finally:
        driver.kill()
        for pid in (root, grandchild, bystander):
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_pid_reused_by_another_process_is_not_killed():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        wrong_start = cluster_reaper.start_time(sleeper.pid) - 1  # as if the listed process had ended
        cluster_reaper.kill({(sleeper.pid, wrong_start)})
        time.sleep(0.5)
        assert sleeper.poll() is None
        cluster_reaper.kill({(sleeper.pid, cluster_reaper.start_time(sleeper.pid))})
        assert sleeper.wait(timeout=5) == -signal.SIGKILL
    finally:
        sleeper.kill()
