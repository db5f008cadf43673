"""rankstream: stream PyTorch profiler traces and Flight Recorder entries from every rank
through Kafka into DuckDB, live, and analyze them across ranks.

Rank side: ``rankstream.init()``, ``span``, ``instant``, ``counter``, ``step``, ``profile``
(see ``rankstream.api``), or a bare :class:`Producer`. Query side: :func:`connect`.

Nothing is imported until it is used: ``import rankstream`` on a training rank loads no DuckDB,
no Arrow and no Kafka client, and no layer below this package imports it.
"""

__version__ = "0.1.0"

__all__ = ["RankstreamError", "Producer", "connect", "init", "shutdown", "span", "instant", "counter", "step",
           "profile", "session", "__version__"]

_API = ("init", "shutdown", "span", "instant", "counter", "step", "profile", "session")


def __getattr__(name: str):
    # The API is cached in the module once resolved: `rankstream.counter(...)` runs on the training
    # thread, and a module __getattr__ plus import lookup on every call cost more than the emit itself.
    if name in _API:
        from rankstream import api

        globals()[name] = value = getattr(api, name)
        return value
    if name == "Producer":
        from rankstream.producers.producer import Producer

        return Producer
    if name == "connect":
        from rankstream.consumers.query import connect

        return connect
    if name == "RankstreamError":
        from rankstream.schemas.errors import RankstreamError

        return RankstreamError
    raise AttributeError(f"module 'rankstream' has no attribute {name!r}")
