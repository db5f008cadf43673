"""The rank side: a producer that never slows a training step, plus its spool and transports.

``Producer`` loads on first use: the file readers in this package (``rankstream merge``,
``rankstream diagnose``) never publish, and the producer's modules took 85 ms of their start.
"""

__all__ = ["Producer", "ProducerStats"]


def __getattr__(name: str):
    if name in __all__:
        from rankstream.producers import producer

        return getattr(producer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
