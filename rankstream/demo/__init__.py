"""The demo job and the synthetic data generators.

``rankstream demo`` runs :func:`rankstream.demo.runner.run_demo`; ``job`` is the real gloo training
job it launches (with injectable faults); ``synthetic`` and ``fr_dump_generator`` make trace events
and Flight Recorder dumps without torch, for the benchmarks and tests. Nothing below the top layer
imports this package.
"""
