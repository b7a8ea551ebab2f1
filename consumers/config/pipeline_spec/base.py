"""What every model of a spec shares: unknown fields refused, values frozen, names of one shape."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

NAME = r"^[a-z][a-z0-9_]{0,39}$"

Name = Annotated[str, Field(pattern=NAME)]
Scalar = str | int | float | bool


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
