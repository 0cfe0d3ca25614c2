"""The gfair services: thin shells whose handlers call the core, and the query service.

Convention every service package follows (`gfair_services.<name>`, `<name>` one of
`SERVICE_NAMES`):

- The package root exports ``Settings``, a pydantic-settings ``BaseSettings`` with
  ``env_prefix="GFAIR_"``, and ``build_service(settings: Settings) -> gfair.bus.Service``.
  Every field is settable from the environment (``GFAIR_QUANTUM_S=2``) and from a flag of the
  same name (``gfair service split_stride --quantum-s 2``); `gfair_services.entrypoint` derives
  the flags from the model, so a new field needs no CLI code. Fields that are not plain scalars
  take JSON on the command line, or whatever their own validator parses.
- Optionally it also exports ``async def serve(settings: Settings) -> None`` when the process
  owns resources beyond its `Service` (the node executor's job supervisor), or is no `Service`
  at all (the query service answers requests; it has no ``build_service``): the runner then
  calls it instead of ``gfair.bus.serve(build_service(settings))``.
- ``__main__.py`` is two lines: ``from gfair_services.entrypoint import run_service`` and
  ``raise SystemExit(run_service("<name>"))``, so ``python -m gfair_services.<name>`` works.
- A service declares what it consumes and runs (`gfair_services.skeleton`: `Consumes`, `Every`
  and its start hook) and `skeleton.declare` builds the `Service`: the whole cluster's
  topology (`topology.cluster_topology()`, so whichever process starts first creates every
  stream and bucket), durables ``<service>-<name>``, the ack wait of ``GFAIR_ACK_WAIT_S``.
  Settings shared by several services are mixins there too (`QuantumSettings`,
  `ThroughputsSettings`), one field each.
- Handlers are idempotent by event id and rebuild their state on start (an ``on_start`` hook)
  from their own bucket and their durable consumers (docs/design.md §3.3).
"""

SERVICE_NAMES: tuple[str, ...] = (
    "profiler",
    "placement",
    "split_stride",
    "trading_auction",
    "failure_detector",
    "node_executor",
    "query",
)
