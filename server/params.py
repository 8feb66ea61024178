"""Path and query parameters the routes share, bounded at the edge: the database's integer columns hold int64, so a
larger id or offset is a 422 naming the parameter, not a 500 from the database driver."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

INT64_MAX = 2**63 - 1

Id = Annotated[int, Path(ge=1, le=INT64_MAX)]
Offset = Annotated[int, Query(ge=0, le=INT64_MAX)]
