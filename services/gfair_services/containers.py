"""The operator's container settings, read alike by placement (admission) and node executors
(`GFAIR_JOB_IMAGES`, `GFAIR_JOB_MOUNTS`, or `gfair up --set job_images=...`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gfair.events.container_policy import ContainerPolicy


def _comma_list(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


class ContainerSettings(BaseSettings):
    """Mixin of the container fields; a service's settings inherit it."""

    model_config = SettingsConfigDict(env_prefix="GFAIR_", extra="ignore")

    job_images: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)] = Field(
        default=(),
        description="Images or registries jobs may run in, by prefix (comma-separated); "
        "empty: no job runs in a container",
    )
    job_mounts: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)] = Field(
        default=(),
        description="Host directories a job's container may mount (comma-separated); empty: none",
    )

    @property
    def container_policy(self) -> ContainerPolicy:
        return ContainerPolicy(self.job_images, self.job_mounts)
