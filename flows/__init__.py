"""Derived tables: cross-rank merge, timelines, step/communication analyses and collective
diagnosis, as Prefect flows over the materialized tables. (Arrives with the analysis issues;
the tables they read are defined in ``rankstream.schemas``.)"""
