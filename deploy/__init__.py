"""How rankstream runs: the embedded broker, `up`/`down`, Kafka plumbing and the in-memory bus."""
