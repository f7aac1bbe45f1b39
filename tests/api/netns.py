"""Run inside `unshare -rn` by tests/api/test_api.py: a `provision api` listener on a non-loopback address.

The namespace is new and empty: a veth pair whose both ends stay in it carries 10.77.0.1, so the
listener is on a real non-loopback interface that nothing outside the namespace can reach.
Prints one JSON object: what each request got.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.api.client import api_server

ADDRESS = "10.77.0.1"


def main(token_file: str) -> int:
    for cmd in (
        "ip link set lo up",
        "ip link add krun0 type veth peer name krun1",
        f"ip addr add {ADDRESS}/24 dev krun0",
        "ip link set krun0 up",
        "ip link set krun1 up",
    ):
        subprocess.run(cmd.split(), check=True)
    token = Path(token_file).read_text().strip()
    seen: dict[str, object] = {}
    with api_server("--token-file", token_file, listen=f"{ADDRESS}:0") as api:
        seen["host"] = api.host
        for name, headers in (
            ("none", {}),
            ("wrong", {"Authorization": "Bearer " + "x" * len(token)}),
            ("basic", {"Authorization": "Basic " + token}),
            ("right", {"Authorization": f"Bearer {token}"}),
        ):
            status, hdrs, body = api.request("GET", "/api/v1/health", headers=headers)
            seen[name] = {"status": status, "body": body, "www-authenticate": hdrs.get("www-authenticate")}
        # a wrong token is refused before the body is even read: no validation, no E007
        job = {"language": "cpu", "gpu": True, "code": "true"}
        status, _, body = api.request("POST", "/api/v1/execute", job, headers={"Authorization": "Bearer nope"})
        seen["execute-wrong"] = {"status": status, "body": body}
        status, _, body = api.request("POST", "/api/v1/execute", job, headers={"Authorization": f"Bearer {token}"})
        seen["execute-right"] = {"status": status, "body": body}
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
