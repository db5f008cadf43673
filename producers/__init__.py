"""The rank side: a producer that never slows a training step (``producers.producer``), its spool
and transports, and the readers that turn trace and Flight Recorder files into the same records."""
