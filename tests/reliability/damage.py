"""Ways to damage a valid bus message, shared by the fuzz test and ``bench/soak.py``.

``mutate(message, how, rng)`` turns one valid ``(topic, key, value)`` into a malformed one: each
``how`` in ``MUTATIONS`` is one kind of damage a hostile or broken producer could send.
``with_payload_of`` and ``with_seq`` make the messages that are wrong only next to others: a repeat
of a batch key with different content, and a sequence gap.
"""

import math

import msgpack

from rankstream.schemas.topics import message_key

MUTATIONS = ("truncate", "random", "wrong_type", "missing", "huge", "deep", "nan", "duration", "version", "kind",
             "payload_version", "other_key", "payload_type", "not_a_map")
_ENVELOPE_FIELDS = ("v", "run", "rank", "world", "session", "seq", "kind", "pv", "sent_ns", "payload")
_KINDS = ("trace_batch", "fr_batch", "pg_config", "rank_meta", "heartbeat")


def mutate(message_tuple, how: str, rng) -> tuple:
    """A malformed (topic, key, value) made from a valid one, ``how`` says which way."""
    topic, key, value = message_tuple
    if how == "truncate":
        return topic, key, value[: rng.randrange(len(value))]
    if how == "random":
        return topic, key, rng.randbytes(rng.randrange(300))
    if how == "not_a_map":
        return topic, key, msgpack.packb(rng.choice([[1, 2], "envelope", 7, None]))
    message = msgpack.unpackb(value, raw=False, strict_map_key=False)
    if how == "wrong_type":
        field = rng.choice(["run", "rank", "seq", "session", "kind", "sent_ns"])
        message[field] = rng.choice([v for v in ([1, 2], {"a": 1}, 3.5, None, b"\x00")
                                     if not isinstance(v, type(message[field]))])
    elif how == "missing":
        del message[rng.choice([f for f in _ENVELOPE_FIELDS if f in message and f != "pv"])]
    elif how == "huge":  # a string past the limit, or an array/map header claiming millions of items
        field = rng.choice(["run", "session", "payload"])
        huge = rng.choice([msgpack.packb("x" * (2 << 20)), b"\xdd" + (50_000_000).to_bytes(4, "big") + b"\x01\x02",
                           b"\xdf" + (3_000_000).to_bytes(4, "big") + b"\xa1a\x01"])
        message[field] = "__huge__"
        return topic, key, msgpack.packb(message, use_bin_type=True).replace(msgpack.packb("__huge__"), huge)
    elif how == "deep":  # nesting deeper than msgpack's packer allows: spliced in as raw bytes
        message["payload"] = "__deep__"
        deep = b"\x91" * rng.randrange(600, 100_000) + b"\x01"
        return topic, key, msgpack.packb(message, use_bin_type=True).replace(msgpack.packb("__deep__"), deep)
    elif how == "nan":
        message[rng.choice(["rank", "seq", "sent_ns"])] = rng.choice([math.nan, math.inf, -math.inf])
    elif how == "duration":  # a trace batch whose durations are negative or absurd
        ints = (message.get("payload") or {}).get("ints") if isinstance(message.get("payload"), dict) else None
        if not ints:
            message["rank"] = -5 - rng.randrange(100)  # not a trace batch: an impossible rank instead
        else:
            count = len(ints["dur_ns"]) // 8
            ints["dur_ns"] = rng.choice([-1, 10**18, -(2**62)]).to_bytes(8, "little", signed=True) * count
    elif how == "version":
        message["v"] = rng.randrange(2, 10**6)
    elif how == "kind":
        message["kind"] = rng.choice(["", "trace", "TRACE_BATCH", "fr_batch2", "\x00", "x" * 40])
    elif how == "payload_version":
        message["pv"] = rng.randrange(50, 10**6)
    elif how == "other_key":
        key = message_key("another-run", 0)
    elif how == "payload_type":
        message["payload"] = rng.choice([42, "text", [1, 2, 3], None, b"raw"])
    return topic, key, msgpack.packb(message, use_bin_type=True)


def _with_fields(message_tuple, **fields) -> tuple:
    """The message with some envelope fields replaced, still well-formed."""
    topic, key, value = message_tuple
    message = {**msgpack.unpackb(value, raw=False, strict_map_key=False), **fields}
    return topic, key, msgpack.packb(message, use_bin_type=True)


def with_payload_of(message_tuple, other_tuple) -> tuple:
    """``message``'s envelope (so its batch key) carrying ``other``'s payload: a conflicting repeat."""
    other = msgpack.unpackb(other_tuple[2], raw=False, strict_map_key=False)
    return _with_fields(message_tuple, payload=other["payload"])


def with_seq(message_tuple, seq: int) -> tuple:
    """The same message under another sequence number (past the stream's end: a gap)."""
    return _with_fields(message_tuple, seq=seq)
