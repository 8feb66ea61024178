"""The REST API's routers, one per resource, mounted by server.app under /api/v1 in this order."""

from server.routes import artifacts, health, jobs, models, records, tokens, workers

ROUTERS = [health.router, tokens.router, models.router, jobs.router, artifacts.router, records.router, workers.router]
