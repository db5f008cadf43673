"""The little wire protocol between the query server and its clients, over a Unix socket.

Request: 4-byte big-endian length, then JSON ``{"sql": str, "params": list|object|null, "write": bool,
"timeout_s": number|null}``,
or ``{"script": [[sql, params], ...], "write": true}`` for statements that must commit together.
Response: one status byte (``A`` Arrow IPC stream follows, ``E`` UTF-8 error message follows),
an 8-byte big-endian length, then the body. Results travel as Arrow so that they arrive as
columns, not rows. The server publishes its socket in a sidecar file beside the database,
``<db>.server.json``, so a client needs nothing but the database path to find it.
"""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["sidecar_path", "send_request", "send_script", "read_request", "send_table", "send_error", "read_response",
           "ServerError"]

_LENGTH = struct.Struct(">I")
_BODY = struct.Struct(">cQ")
MAX_REQUEST_BYTES = 1 << 20


class ServerError(Exception):
    """The server answered with an error message (bad SQL, a write on a read-only session)."""


def sidecar_path(db_path: Path) -> Path:
    return Path(str(Path(db_path).resolve()) + ".server.json")


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed mid-message")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def send_request(sock: socket.socket, sql: str, params: list | dict | None, *, write: bool,
                 timeout_s: float | None = None) -> None:
    _send(sock, {"sql": sql, "params": params, "write": write, "timeout_s": timeout_s})


def send_script(sock: socket.socket, statements: list[tuple[str, Any]]) -> None:
    _send(sock, {"script": [[sql, params] for sql, params in statements], "write": True})


def _send(sock: socket.socket, request: dict) -> None:
    body = json.dumps(request).encode()
    sock.sendall(_LENGTH.pack(len(body)) + body)


def read_request(sock: socket.socket) -> dict[str, Any]:
    (size,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))
    if size > MAX_REQUEST_BYTES:
        raise ValueError(f"request of {size} bytes is larger than {MAX_REQUEST_BYTES}")
    request = json.loads(_recv_exactly(sock, size))
    if isinstance(request, dict) and isinstance(request.get("script"), list):
        if all(isinstance(s, list) and len(s) == 2 and isinstance(s[0], str) for s in request["script"]):
            return request
    if not isinstance(request, dict) or not isinstance(request.get("sql"), str):
        raise ValueError("request must be a JSON object with a string 'sql' or a 'script' of [sql, params]")
    return request


def send_table(sock: socket.socket, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    body = sink.getvalue()
    sock.sendall(_BODY.pack(b"A", body.size))
    sock.sendall(memoryview(body))


def send_error(sock: socket.socket, message: str) -> None:
    body = message.encode()
    sock.sendall(_BODY.pack(b"E", len(body)) + body)


def read_response(sock: socket.socket) -> pa.Table:
    status, size = _BODY.unpack(_recv_exactly(sock, _BODY.size))
    body = _recv_exactly(sock, size)
    if status == b"E":
        raise ServerError(body.decode(errors="replace"))
    return pa.ipc.open_stream(pa.py_buffer(body)).read_all()
