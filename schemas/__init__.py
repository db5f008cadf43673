"""What travels on the bus: the envelope, payload kinds, the codec, topics and the DuckDB schema."""

from rankstream.schemas.codec import MAX_MESSAGE_BYTES, DecodeFailure, decode, encode, encode_wire
from rankstream.schemas.envelope import BatchKey, Envelope, PayloadKind, Stream
from rankstream.schemas.fields import PayloadError
from rankstream.schemas.records import FrBatch, Heartbeat, PgConfig, RankMeta
from rankstream.schemas.topics import all_topics, message_key, topic_for
from rankstream.schemas.trace import TraceBatch

__all__ = [
    "BatchKey", "DecodeFailure", "Envelope", "FrBatch", "Heartbeat", "MAX_MESSAGE_BYTES",
    "PayloadError", "PayloadKind", "PgConfig", "RankMeta", "Stream", "TraceBatch",
    "all_topics", "decode", "encode", "encode_wire", "message_key", "topic_for",
]
