from gfair_services.entrypoint import run_service

raise SystemExit(run_service("query"))
