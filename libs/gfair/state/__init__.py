"""Service state records kept in JetStream key-value buckets (docs/design.md §3.3).

Each bucket has exactly one writer service; every other service and every tool may read it.
The record models here are part of the published contract, like the events.
"""
