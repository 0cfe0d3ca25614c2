"""Moving a PyTorch job's tensors to host memory while it is parked, and back.

Imported only by `Job.register_torch`, so the SDK itself never needs torch. Modules move with
`module.to`, which keeps the parameter objects an optimizer refers to; an optimizer's state
tensors (momentum, Adam's moments) move one by one. Copies between host and device are exact,
so a resumed job computes bit for bit what it would have without the pause.
"""

from __future__ import annotations

from typing import Any

import torch


class TorchState:
    def __init__(self, *objects: Any) -> None:
        self._modules: list[torch.nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        # Where each offloaded thing was: modules by device, optimizer state entries by key
        # (only those that were on a device: Adam's `step` lives on the host and stays there).
        self._module_devices: list[tuple[torch.nn.Module, torch.device]] = []
        self._moved: list[tuple[dict[Any, Any], Any, torch.device]] = []
        self.track(*objects)

    def track(self, *objects: Any) -> None:
        """Move these from now on, instead of those named before (registered with a job once,
        this follows a framework's trainer, which may build its optimizers anew)."""
        if self._module_devices or self._moved:
            raise RuntimeError("offloaded: restore before tracking other objects")
        for obj in objects:
            if not isinstance(obj, torch.nn.Module | torch.optim.Optimizer):
                raise TypeError(f"register torch modules and optimizers, not {type(obj)!r}")
        self._modules = [obj for obj in objects if isinstance(obj, torch.nn.Module)]
        self._optimizers = [obj for obj in objects if isinstance(obj, torch.optim.Optimizer)]

    def offload(self) -> None:
        host = torch.device("cpu")
        for module in self._modules:
            device = next((p.device for p in module.parameters()), host)
            if device != host:
                self._module_devices.append((module, device))
                module.to(host)
        for optimizer in self._optimizers:
            for state in optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and value.device != host:
                        self._moved.append((state, key, value.device))
                        state[key] = value.to(host)
        if (self._module_devices or self._moved) and torch.cuda.is_available():
            torch.cuda.empty_cache()  # the GPU's memory goes back, not just to the cache

    def restore(self) -> None:
        for module, device in self._module_devices:
            module.to(device)
        for state, key, device in self._moved:
            state[key] = state[key].to(device)
        self._module_devices.clear()
        self._moved.clear()


def movable(*objects: Any) -> list[Any]:
    """Those of `objects` that `TorchState` moves (a framework may hold optimizers of its own
    kinds: those stay where they are)."""
    return [obj for obj in objects if isinstance(obj, torch.nn.Module | torch.optim.Optimizer)]
