"""Who may call the API: loopback listeners are open, any other needs a bearer token.

The token comes from a file only its owner can read (checked, not assumed) and is compared
in constant time, so neither the file's mode nor response timing leaks it.
"""

from __future__ import annotations

import hmac
import os
import stat
from pathlib import Path

from provision.api.settings import Listen
from provision.core.errors import InvalidValue, Unauthorized

MIN_TOKEN_CHARS = 16


def read_token_file(path: Path) -> str:
    """The token in ``path``; E003 unless the file is ours, mode 0600 or stricter, and the token long enough."""
    try:
        st = path.stat()
    except OSError as exc:
        raise InvalidValue(f"--token-file {path}: {exc.strerror}", fix="write a token file: umask 077; ...") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidValue(f"--token-file {path}: not a regular file")
    if st.st_uid != os.getuid():
        raise InvalidValue(
            f"--token-file {path}: owned by uid {st.st_uid}, not by this user ({os.getuid()})",
            fix=f"chown {os.getuid()} {path}",
        )
    if st.st_mode & 0o077:
        raise InvalidValue(
            f"--token-file {path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read it",
            fix=f"chmod 600 {path}",
        )
    token = path.read_text(encoding="utf-8", errors="strict").strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token) or not token.isprintable():
        raise InvalidValue(
            f"--token-file {path}: the token must be one word of at least {MIN_TOKEN_CHARS} printable characters",
            fix=f"head -c 32 /dev/urandom | base64 > {path}",
        )
    return token


def require_token_policy(listen: Listen, token: str | None) -> None:
    """Refuse to start a listener reachable from other hosts without a token."""
    if not listen.loopback and token is None:
        raise InvalidValue(
            f"--listen {listen.host}:{listen.port} is not a loopback address and no --token-file was given",
            fix="add --token-file FILE (mode 0600), or listen on 127.0.0.1",
        )


def check_bearer(header: str | None, token: str | None) -> None:
    """E050 unless ``header`` is ``Bearer <token>``; no token configured means no check."""
    if token is None:
        return
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized("missing bearer token", fix="send the header: Authorization: Bearer <token>")
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("wrong bearer token", fix="use the token from the server's --token-file")
