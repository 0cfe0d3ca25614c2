"""Train a small PyTorch model the way gfair expects: resume, report, checkpoint, yield.

    python examples/pytorch_train.py --steps 2000

Outside gfair it trains on its own and checkpoints under ./.gfair; started by a gfair node
executor, the same code is time-sliced, suspended, resumed and migrated.

Everything gfair-specific is the `job` object: it says where to resume from, takes one report
per mini-batch (that is how the scheduler measures this job's speed on each GPU generation),
stores checkpoints atomically next to the previous one, and says when the GPUs must be given
back. gfair sets CUDA_VISIBLE_DEVICES, so `cuda` is always this job's own first GPU.

A yield parks in place when gfair allows it (`job.suspend`): the model and optimizer move to
host memory, the GPU is freed, and the same process continues when the job's next time slice
is on the same GPUs, without a checkpoint or a new process; a move elsewhere has it checkpoint
and exit. `--restart-per-slice` always checkpoints and exits instead (every slice a new
process), for comparison.

It calls `Job.from_env()` before it touches a GPU (torch initialises CUDA lazily, at the first
`torch.cuda` call, and reads CUDA_VISIBLE_DEVICES then): that is the contract of a job
submitted with `gfair submit --prepare`. gfair may then start its process before it has GPUs,
with none visible: it imports torch and builds its model and optimizer on the CPU, and
`Job.from_env()` waits, parked, until its first slice gives it GPUs (it sets
CUDA_VISIBLE_DEVICES to them before returning), so those seconds are not spent holding a GPU.

The data is synthetic and derived from the step number, so a resumed run sees exactly the
batches it would have seen without the interruption. Needs torch (not a gfair dependency).
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch
from torch import nn

from gfair.sdk import Job

MODEL_FILE = "model.pt"


def build_model(features: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, classes),
    )


def batch(
    step: int, size: int, projection: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mini-batch of `step`: a pure function of the step, so resuming replays nothing."""
    generator = torch.Generator().manual_seed(step)
    inputs = torch.randn(size, projection.shape[0], generator=generator)
    # A learnable target: the class is the argmax of a fixed projection of the inputs.
    targets = (inputs @ projection).argmax(dim=1)
    return inputs.to(device), targets.to(device)


def save(
    job: Job, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, loss: float
) -> None:
    # JSON state for gfair and humans; tensors in a file written inside the atomic checkpoint.
    with job.checkpoint({"step": step, "loss": loss}) as directory:
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
            directory / MODEL_FILE,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5000, help="mini-batches in total")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument(
        "--restart-per-slice",
        action="store_true",
        help="never park in place: every yield checkpoints and exits",
    )
    args = parser.parse_args(argv)

    # What needs no GPU comes first: a prepared start does it before its first slice. (The
    # first optimizer imports torch's compiler stack, about a second of CPU.)
    torch.manual_seed(0)
    model = build_model(args.features, args.classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    projection = torch.randn(
        args.features, args.classes, generator=torch.Generator().manual_seed(12345)
    )

    job = Job.from_env()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # In place: the parameters stay the optimizer's (it holds no state before its first step).
    model.to(device)

    state = job.load_checkpoint()
    start = 0
    if state is not None and job.restored is not None:
        tensors = torch.load(job.restored.file(MODEL_FILE), map_location=device, weights_only=True)
        model.load_state_dict(tensors["model"])
        optimizer.load_state_dict(tensors["optimizer"])
        start = int(state["step"])
        print(f"resumed at step {start} (loss {state['loss']:.4f}) on {device}", flush=True)
    if start >= args.steps:  # finished before the last interruption
        job.complete()
        return 0

    # What moves to host memory while parked (on the CPU: nothing to move).
    job.register_torch(model, optimizer)
    model.train()
    loss = torch.zeros((), device=device)
    for step in range(start, args.steps):
        inputs, targets = batch(step, args.batch_size, projection, device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        # One report per mini-batch; cheap (a few are written down), and no GPU sync is needed.
        job.report(step)
        done = step + 1
        if job.should_yield():
            # At a mini-batch boundary the model and optimizer are consistent: park, or save
            # and go.
            last = float(loss.item())
            if args.restart_per_slice:
                save(job, model, optimizer, done, last)
                job.exit_for_yield()
            job.suspend(functools.partial(save, job, model, optimizer, done, last))
        if done % args.checkpoint_every == 0 and done < args.steps:
            save(job, model, optimizer, done, float(loss.item()))

    save(job, model, optimizer, args.steps, float(loss.item()))
    job.complete()
    print(f"finished {args.steps} steps, final loss {loss.item():.4f}", flush=True)
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
