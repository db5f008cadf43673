"""The codec: the only module that imports msgpack.

``encode`` turns an :class:`Envelope` into bytes; ``decode`` turns bytes into an ``Envelope`` or a
:class:`DecodeFailure` and never raises, because one bad message must not stop a materializer.
Unpacking is bounded (string, binary, array and map lengths, nesting and total size) so that a
hostile message cannot make the consumer allocate without limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgpack

from rankstream.schemas.envelope import ENVELOPE_VERSION, Envelope, PayloadKind, Stream
from rankstream.schemas.fields import PayloadError
from rankstream.schemas.registry import CURRENT_VERSIONS, read_payload

__all__ = ["encode", "encode_wire", "decode", "DecodeFailure", "MAX_MESSAGE_BYTES", "pack_local", "unpack_local",
           "peek_sequence"]

#: Largest message the producer sends and the consumer accepts.
MAX_MESSAGE_BYTES = 16 << 20
_LIMITS = dict(
    max_str_len=1 << 20,
    max_bin_len=MAX_MESSAGE_BYTES,
    max_array_len=MAX_MESSAGE_BYTES // 4,
    max_map_len=1 << 16,
)


@dataclass(frozen=True, slots=True)
class DecodeFailure:
    """Why a message could not be used; ``run_id``/``rank`` are filled when the envelope was readable."""

    reason: str
    run_id: str | None = None
    rank: int | None = None


def encode_wire(*, run_id: str, rank: int, world_size: int, session_id: str, seq: int,
                kind: PayloadKind, wire_payload: Any, sent_at_ns: int | None = None,
                payload_version: int | None = None) -> bytes:
    """Encode an envelope around a payload that is already in wire layout (the producer's fast path)."""
    return msgpack.packb(
        {
            "v": ENVELOPE_VERSION,
            "run": run_id,
            "rank": rank,
            "world": world_size,
            "stream": kind.stream.value,
            "session": session_id,
            "seq": seq,
            "kind": kind.value,
            "pv": CURRENT_VERSIONS[kind] if payload_version is None else payload_version,
            "sent_ns": time.time_ns() if sent_at_ns is None else sent_at_ns,
            "payload": wire_payload,
        },
        use_bin_type=True,
    )


def encode(envelope: Envelope) -> bytes:
    return encode_wire(
        run_id=envelope.run_id,
        rank=envelope.rank,
        world_size=envelope.world_size,
        session_id=envelope.session_id,
        seq=envelope.seq,
        kind=envelope.kind,
        wire_payload=envelope.payload.to_wire(),
        sent_at_ns=envelope.sent_at_ns,
        payload_version=envelope.payload_version,
    )


def pack_local(wire_payload: Any) -> bytes:
    """A payload in wire layout as bytes for a file this process writes and reads back itself
    (the trace importer parks batches between its passes); not a bus message."""
    return msgpack.packb(wire_payload, use_bin_type=True)


def unpack_local(raw: bytes) -> Any:
    """What :func:`pack_local` wrote; bounded like every other unpacking."""
    return msgpack.unpackb(raw, raw=False, strict_map_key=True, **_LIMITS)


def _field(message: dict, name: str, kind: type) -> Any:
    value = message.get(name)
    if type(value) is not kind:
        raise PayloadError(f"envelope field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def peek_sequence(raw: bytes) -> tuple[str, str, int] | None:
    """``(stream, session_id, seq)`` of an encoded envelope, without decoding its payload: a
    producer reading back its spool needs only these to match the materializer's announcements.
    None for anything that is not an envelope with them."""
    try:
        unpacker = msgpack.Unpacker(raw=False, **_LIMITS)
        unpacker.feed(raw)
        found: dict[str, Any] = {}
        for _ in range(unpacker.read_map_header()):
            name = unpacker.unpack()
            if name in ("stream", "session", "seq"):
                found[name] = unpacker.unpack()
                if len(found) == 3:
                    break
            else:
                unpacker.skip()
    except Exception:  # msgpack raises several unrelated types; the caller treats it as "no key"
        return None
    stream, session, seq = found.get("stream"), found.get("session"), found.get("seq")
    if type(stream) is str and type(session) is str and type(seq) is int:
        return stream, session, seq
    return None


def decode(raw: bytes | None) -> Envelope | DecodeFailure:
    """Bytes to an Envelope with a validated, upcast payload, or a DecodeFailure saying why."""
    if raw is None:
        return DecodeFailure("empty message (tombstone)")
    if len(raw) > MAX_MESSAGE_BYTES:
        return DecodeFailure(f"message of {len(raw)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte cap")
    try:
        message = msgpack.unpackb(raw, raw=False, strict_map_key=True, **_LIMITS)
    except Exception as exc:  # msgpack raises several unrelated types (ValueError, StackError, ...)
        return DecodeFailure(f"not msgpack: {type(exc).__name__}: {exc}"[:500])
    if not isinstance(message, dict):
        return DecodeFailure(f"envelope must be a map, got {type(message).__name__}")
    run_id = message.get("run") if type(message.get("run")) is str else None
    rank = message.get("rank") if type(message.get("rank")) is int else None
    try:
        if message.get("v") != ENVELOPE_VERSION:
            raise PayloadError(f"envelope version {message.get('v')!r} is not {ENVELOPE_VERSION}")
        run_id = _field(message, "run", str)
        if not run_id or len(run_id) > 256:
            raise PayloadError("run id must be 1..256 characters")
        rank = _field(message, "rank", int)
        world_size = _field(message, "world", int)
        if not 0 <= rank < max(world_size, 1) or world_size > 1 << 20:
            raise PayloadError(f"rank {rank} is not within world size {world_size}")
        try:
            kind = PayloadKind(_field(message, "kind", str))
            stream = Stream(_field(message, "stream", str))
        except ValueError as exc:
            raise PayloadError(f"unknown payload kind or stream: {exc}") from None
        if kind.stream is not stream:
            raise PayloadError(f"payload kind {kind.value} does not travel on stream {stream.value}")
        session_id = _field(message, "session", str)
        seq = _field(message, "seq", int)
        if seq < 0 or not session_id:
            raise PayloadError("session id must be non-empty and seq non-negative")
        version = _field(message, "pv", int)
        sent_at_ns = _field(message, "sent_ns", int)
        payload = read_payload(kind, version, message.get("payload"))
    except PayloadError as exc:
        return DecodeFailure(str(exc)[:500], run_id, rank)
    except Exception as exc:  # a validator bug must still not stop the consumer
        return DecodeFailure(f"invalid payload: {type(exc).__name__}: {exc}"[:500], run_id, rank)
    return Envelope(
        run_id=run_id,
        rank=rank,
        world_size=world_size,
        stream=stream,
        session_id=session_id,
        seq=seq,
        kind=kind,
        payload_version=CURRENT_VERSIONS[kind],
        sent_at_ns=sent_at_ns,
        payload=payload,
    )
