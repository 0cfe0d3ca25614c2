"""The base of every record kept in a key-value bucket."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """Frozen, and read by older versions too: a field a newer version added is ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)
