"""The rank side: a producer that never slows a training step, plus its spool and transports."""

from rankstream.producers.producer import Producer, ProducerStats

__all__ = ["Producer", "ProducerStats"]
