"""How rankstream runs its infrastructure: the embedded broker launcher, compose files and Prefect
deployments. Imports only ``schemas``."""
