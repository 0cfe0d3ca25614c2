"""Which container images a job may run in, and which host paths it may mount: the operator's
rule, checked by placement at admission (a refused job is rejected, nothing of it stored) and by
the node again before it starts a container.

Images and registries are allowed by prefix (``registry.example.com/`` allows all of that
registry, ``gfair-local/python:`` every tag of one image); none allowed (the default): no job
runs in a container. Host paths are allowed by directory (``/data`` allows ``/data`` and what is
under it, never ``/database``); none by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True, slots=True)
class ContainerPolicy:
    images: tuple[str, ...] = ()
    mount_roots: tuple[str, ...] = ()

    def refusal(self, image: str | None, mounts: Sequence[str]) -> str | None:
        """Why this image or one of these mounts is not allowed; None when all are."""
        if image is None:
            return None
        if not any(image.startswith(prefix) for prefix in self.images):
            allowed = ", ".join(self.images) or "none (the operator's job_images)"
            return f"image {image!r} is not allowed here; allowed images: {allowed}"
        for mount in mounts:
            host = PurePosixPath(mount.split(":", 1)[0])
            inside = any(host.is_relative_to(root) for root in self.mount_roots)
            if ".." in host.parts or not inside:
                allowed = ", ".join(self.mount_roots) or "none (the operator's job_mounts)"
                return f"mount {mount!r}: host path {host} may not be mounted; allowed: {allowed}"
        return None
