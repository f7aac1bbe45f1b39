"""The execution API on real guests: `provision api` as a subprocess on 127.0.0.1, QEMU (TCG here)
+ virglrenderer Venus + lavapipe behind it, exactly as `provision run` boots them.

Boots are the cost (about a minute each under TCG on 2 idle cores), so each test boots only
what its claim needs: 3 GPU guests, 10 CPU guests (2 at a time), one streamed guest; the
timeout, disconnect and SIGTERM tests stop their guests within seconds of QEMU starting.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pytest

from provision.core import catalog
from provision.hosts.linux.run import facts as linux
from provision.hosts.linux.run import slots
from provision.hosts.linux.tools import host_tools
from tests.api.client import Api, api_server, wait_gone
from tests.helpers import gone

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.podman]

VENUS = re.compile(r"^Virtio-GPU Venus \(")


@pytest.fixture(scope="module")
def guests() -> None:
    """Host tools and the llama-linux and cpu VM disks exist, so the tests below time boots, not builds."""
    host_tools.make()
    for name in ("llama-linux", "cpu"):
        linux.root_disk(catalog.load().get(name))


@pytest.fixture(scope="module")
def api(guests: None) -> Iterator[Api]:
    with api_server("--max-vms", "3", "--grace", "5") as server:
        yield server


def at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def test_three_gpu_jobs_two_run_at_once_the_third_after_one_ends(api: Api) -> None:
    job = {"language": "llama-linux", "gpu": True, "timeout": 1500, "code": "vulkaninfo --summary"}
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: api.execute(job), range(3)))
    results = []
    for status, _, body in answers:
        assert status == 200, (body, api.tail())
        assert body["exit_code"] == 0, body["stderr"][-2000:]
        assert VENUS.match(body["device"] or ""), body["device"]
        assert "DRIVER_ID_MESA_VENUS" in body["stdout"]
        assert body["route"] == "venus" and body["gpu"] is True
        assert gone(body["qemu_pid"])
        results.append(body)
    first, second, third = sorted(results, key=lambda r: at(r["started_at"]))
    for r in (first, second, third):  # shown with pytest -rP: the evidence in the report
        print(f"job {r['job']}: started {r['started_at']} ended {r['ended_at']} device {r['device']}")
    spans = [(at(r["started_at"]), at(r["ended_at"])) for r in (first, second, third)]
    running_at = [sum(1 for s, e in spans if s <= start < e) for start, _ in spans]
    # two ran at once (other runs on a shared host may hold a slot for a while, so not necessarily
    # the first two), and never three: the last one started only once another had ended
    assert max(running_at) == 2, spans
    assert at(third["started_at"]) >= min(at(first["ended_at"]), at(second["ended_at"]))


def test_gpu_on_the_cpu_stack_is_400_e007_at_once_and_starts_no_vm(api: Api) -> None:
    start = time.monotonic()
    status, _, body = api.execute({"language": "cpu", "gpu": True, "timeout": 60, "code": "true"})
    took = time.monotonic() - start
    assert status == 400 and body["error"]["code"] == "E007", body
    assert took < 2.0  # a VM boot takes minutes; 2 s leaves room for a loaded runner
    assert api.children() == []
    assert api.request("GET", "/api/v1/health")[2]["running"] == 0


def test_gpu_slots_are_the_ones_provision_run_takes(guests: None) -> None:
    """A slot held the way `provision run --gpu` holds it (slots.acquire, same files) is one the API
    cannot take: with one slot on the host, an API GPU job gets 503 E022 and starts no VM."""
    one = {slots.ENV_VAR: "1"}
    with api_server(env=one) as server:
        # Other runs on this host may hold the slot now: wait for it, as `provision run --gpu` would.
        held = slots.acquire(time.monotonic() + 1800, count=1)
        try:
            start = time.monotonic()
            status, headers, body = server.execute(
                {"language": "llama-linux", "gpu": True, "timeout": 5, "code": "true"}
            )
            assert status == 503 and body["error"]["code"] == "E022", body
            assert int(headers["retry-after"]) > 0
            assert 5 <= time.monotonic() - start < 30
            assert server.children() == []
        finally:
            held.release()


def test_a_job_past_its_timeout_is_408_and_its_vm_is_gone(api: Api) -> None:
    status, _, body = api.execute({"language": "cpu", "timeout": 30, "code": "sleep 600"})
    assert status == 408 and body["error"]["code"] == "E021", body
    m = re.search(r"QEMU \(pid (\d+)\) was stopped", body["error"]["message"])
    assert m, body
    assert gone(int(m.group(1)))
    assert api.children() == []


def test_a_stream_delivers_lines_in_order_before_the_job_ends(api: Api) -> None:
    code = "for i in 1 2 3 4 5; do echo line$i; echo err$i >&2; sleep 1; done; exit 3"
    with api.stream({"language": "cpu", "timeout": 900, "code": code}) as (resp, records):
        assert resp.status == 200 and resp.getheader("content-type") == "application/x-ndjson"
        got = list(records)
    kinds = [r["event"] for _, r in got]
    assert kinds[0] == "accepted" and kinds[1] == "started" and kinds[-1] == "exit", kinds
    out = [(t, r["data"]) for t, r in got if r["event"] == "stdout"]
    assert [d for _, d in out] == [f"line{i}\n" for i in range(1, 6)]
    assert [r["data"] for _, r in got if r["event"] == "stderr"] == [f"err{i}\n" for i in range(1, 6)]
    exit_time, final = got[-1]
    assert final["exit_code"] == 3 and final["stdout"] == "".join(d for _, d in out)
    # line1 reached us while the guest still had four seconds of work left
    assert exit_time - out[0][0] > 3
    assert out[-1][0] - out[0][0] > 3


def test_a_client_that_goes_away_cancels_its_guest(api: Api) -> None:
    with api.stream({"language": "cpu", "timeout": 900, "code": "sleep 600"}) as (_, records):
        started = next(r for _, r in records if r["event"] == "started")
    assert wait_gone(started["qemu_pid"], 30)
    assert any("stream closed early" in line for line in api.log)


def test_a_client_that_leaves_execute_cancels_its_guest(api: Api) -> None:
    conn = socket.create_connection((api.host, api.port))
    body = json.dumps({"language": "cpu", "timeout": 900, "code": "sleep 600"}).encode()
    head = f"POST /api/v1/execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    conn.sendall(head.encode() + b"\r\n\r\n" + body)
    end = time.monotonic() + 120
    while api.request("GET", "/api/v1/health")[2]["running"] == 0 and time.monotonic() < end:
        time.sleep(0.5)
    vms = api.children()
    assert vms, "no VM started"
    conn.close()
    assert all(wait_gone(pid, 30) for pid in vms)
    assert any("client went away" in line for line in api.log)


def test_ten_cpu_jobs_with_max_vms_2_all_complete_two_at_a_time(guests: None) -> None:
    with api_server("--max-vms", "2") as small:
        job = {"language": "cpu", "timeout": 1800, "code": "ls /sys/class/net; nproc"}
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda _: small.execute(job), range(10)))
    bodies: list[dict[str, Any]] = []
    for status, _, body in answers:
        assert status == 200 and body["exit_code"] == 0, (body, api.tail())
        # the guest has no network: only the loopback interface
        assert body["stdout"].split()[0] == "lo" and body["device"] == "cpu"
        bodies.append(body)
    spans = [(at(b["started_at"]), at(b["ended_at"])) for b in bodies]
    for start, _ in spans:
        assert sum(1 for s, e in spans if s <= start < e) <= 2


def test_sigterm_stops_running_guests_within_the_grace_period(guests: None) -> None:
    with (
        api_server("--grace", "3") as server,
        server.stream({"language": "cpu", "timeout": 900, "code": "echo up; sleep 600"}) as (_, records),
    ):
        started = next(r for _, r in records if r["event"] == "started")
        server.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        rest = [r for _, r in records]
        server.proc.wait(timeout=60)
        assert time.monotonic() - sent < 30
    assert rest[-1]["event"] == "error" and rest[-1]["error"]["code"] == "E026", rest[-3:]
    assert rest[-1]["status"] == 503
    assert gone(started["qemu_pid"])
