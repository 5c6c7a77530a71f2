"""A local run seen from outside, through a real `asyncrl train` process and its Ray cluster: every socket
any of its processes listens on is on loopback; a client without the run's token is refused; killing the
driver ends every process of the run; SIGTERM while the run starts exits with status 143 and one line."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import ray  # noqa: F401  (puts Ray's bundled psutil on the path)
import psutil

FINISH_S = 600


def start_cli_run(config_path: Path, log_path: Path) -> subprocess.Popen:
    """`asyncrl train` in a session of its own (as a user starts it from a shell), its output in `log_path`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    with log_path.open("w") as log:
        return subprocess.Popen([sys.executable, "-m", "asyncrl.cli", "train", str(config_path)],
                                env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)


def try_to_join(gcs_port: int) -> str:
    """What a client on this machine without the run's token gets when it joins the cluster: Ray retries a
    refused connection for minutes, so the client is stopped after 30 s. (Ray would rewrite 127.0.0.1 into the
    machine's own address, where nothing listens, unless told the cluster is a one-machine one.)"""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_AUTH_TOKEN", None)
    client = subprocess.Popen([sys.executable, "-c", f"import ray; ray.init(address='127.0.0.1:{gcs_port}'); "
                                                     f"print('connected', ray.get(ray.put(1)))"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        return client.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        client.kill()
        return client.communicate()[0]


def run_processes(driver: psutil.Process) -> list[psutil.Process]:
    try:
        return [driver, *driver.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def listening_sockets(processes: list[psutil.Process]) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket of `processes`."""
    found = set()
    for process in processes:
        try:
            name = process.name()
            found |= {(name, connection.laddr.ip, connection.laddr.port)
                      for connection in process.net_connections("tcp") if connection.status == psutil.CONN_LISTEN}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def is_loopback(address: str) -> bool:
    parsed = ipaddress.ip_address(address.split("%")[0])
    return parsed.is_loopback or (parsed.version == 6 and parsed.ipv4_mapped is not None
                                  and parsed.ipv4_mapped.is_loopback)


def external_addresses() -> list[str]:
    return [entry.address for entries in psutil.net_if_addrs().values() for entry in entries
            if entry.family == socket.AF_INET and not ipaddress.ip_address(entry.address).is_loopback]


def wait_for_text(log_path: Path, text: str, process: subprocess.Popen, timeout_s: float = FINISH_S) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log_path.read_text():
        assert process.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {text!r} in the run's output in {timeout_s:.0f}s"
        time.sleep(0.1)


def alive(processes: list[psutil.Process]) -> list[str]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{process.name()} (pid {process.pid})")
        except psutil.NoSuchProcess:
            pass
    return left


def wait_until_gone(processes: list[psutil.Process], timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(processes)


def kill_all(processes: list[psutil.Process]) -> None:
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


def test_a_local_run_listens_on_loopback_only_and_refuses_a_client_without_its_token(write_run_config, tmp_path):
    """Sockets are collected from the driver's whole process tree (GCS, raylet, Ray's agents, every actor
    worker, the scoring processes) several times a second from start to finish, so short-lived listeners
    (torch.distributed's stores, gloo's pairs) are seen too."""
    log_path = tmp_path / "run.log"
    process = start_cli_run(write_run_config("trainer.total_steps=6"), log_path)
    driver = psutil.Process(process.pid)
    seen: set[tuple[str, str, int]] = set()
    refused_client: str | None = None
    unreachable: list[str] = []
    try:
        while process.poll() is None:
            seen |= listening_sockets(run_processes(driver))
            gcs_ports = sorted(port for name, _, port in seen if name == "gcs_server")
            if refused_client is None and gcs_ports and "step 1/" in log_path.read_text():
                for address in external_addresses():  # nothing answers on the machine's own addresses
                    for _, _, port in seen:
                        with socket.socket() as probe:
                            probe.settimeout(5)
                            if probe.connect_ex((address, port)) == 0:
                                unreachable.append(f"{address}:{port}")
                refused_client = try_to_join(gcs_ports[0])
            time.sleep(0.2)
        assert process.returncode == 0, log_path.read_text()[-3000:]
    finally:
        kill_all(run_processes(driver))
    names = {name for name, _, _ in seen}
    assert {"gcs_server", "raylet"} <= names and any(name.startswith("ray::TrainerRank") for name in names), seen
    assert all(is_loopback(address) for _, address, _ in seen), \
        sorted(entry for entry in seen if not is_loopback(entry[1]))
    assert unreachable == []
    assert refused_client is not None, "the run ended before a client could try to join it"
    assert "Authentication token is missing or incorrect" in refused_client and "connected" not in refused_client, \
        refused_client[-2000:]


def test_killing_the_driver_ends_every_process_of_its_cluster(write_run_config, tmp_path):
    log_path = tmp_path / "run.log"
    process = start_cli_run(write_run_config("trainer.total_steps=200"), log_path)
    driver = psutil.Process(process.pid)
    try:
        wait_for_text(log_path, "step 1/", process)
        processes = run_processes(driver)
        names = [process.name() for process in processes]
        assert "raylet" in names and "ray::DashboardAgent" in names and "ray::RuntimeEnvAgent" in names, names
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        # Ray's agents alone outlived a killed driver by 60-90 s; the reaper ends them within a poll.
        assert wait_until_gone(processes, timeout_s=15) == []
    finally:
        kill_all(run_processes(driver))


def test_sigterm_while_the_run_starts_exits_143_with_one_line_and_leaves_nothing(write_run_config, tmp_path):
    """SIGTERM once the driver's Ray core is up (it installs a crash-dump handler for SIGTERM) and the run's
    actors are being placed: one line, status 143, no crash dump, and no process of the run left."""
    log_path = tmp_path / "run.log"
    process = start_cli_run(write_run_config("trainer.total_steps=2"), log_path)
    driver = psutil.Process(process.pid)
    try:
        wait_for_text(log_path, "placement:", process)
        processes = run_processes(driver)
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=120) == 143, log_path.read_text()[-3000:]
        output = log_path.read_text()
        assert "stopped by SIGTERM outside a training step (while the run was starting or closing)" in output
        assert "SIGTERM received at time" not in output and "Traceback" not in output, output[-3000:]
        assert wait_until_gone(processes, timeout_s=15) == []
    finally:
        kill_all(run_processes(driver))
