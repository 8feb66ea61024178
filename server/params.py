"""Path and query parameters the routes share, bounded at the edge by the database column they are compared with: a
larger id is a 422 naming the parameter, not a 500 from the database driver. SQLAlchemy's psycopg dialect casts
every bound parameter to its column's type (`id = %(id)s::INTEGER`), so on PostgreSQL an id past its column's range
is an error even where no row could match."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Path, Query
from pydantic import WithJsonSchema

INT32_MAX = 2**31 - 1  # an `Integer` column: the ids of teams, tokens, models, jobs, artifacts (PostgreSQL integer)
INT64_MAX = 2**63 - 1  # a `BigInteger` column: the ids of tuning records and job points; offsets (LIMIT/OFFSET bigint)

Id = Annotated[int, Path(ge=1, le=INT32_MAX)]
BigId = Annotated[int, Path(ge=1, le=INT64_MAX)]
Offset = Annotated[int, Query(ge=0, le=INT64_MAX)]
# the SSE reconnect header (a point id, compared with a BigInteger column); described as a plain integer, since a
# header is absent or a number, never JSON's null
LastEventId = Annotated[
    int | None, Header(ge=0, le=INT64_MAX), WithJsonSchema({"type": "integer", "minimum": 0, "maximum": INT64_MAX})
]
