"""A data-parallel PyTorch job that gpufleet can resize: copy it and put your model and data in.

    # elastic.yaml
    name: elastic-demo
    command: ["python", "elastic_ddp.py", "--steps", "2000", "--global-batch", "64"]
    workers: 2
    min_workers: 1
    grace_period: 60s

    gpufleet submit elastic.yaml

Every worker gets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from gpufleet (no torchrun needed). When
gpufleet resizes the job, each worker gets the job's checkpoint signal (SIGTERM unless the job says
otherwise): the workers agree on a step, rank 0 saves a checkpoint in the working folder, and all exit 0.
gpufleet then starts the new set of workers under the same attempt, with the new WORLD_SIZE and
GPUFLEET_RESIZE_COUNT > 0; they load the checkpoint and go on. The same happens on a preemption (the next
attempt finds the checkpoint in the job's working folder, which is kept across attempts).

The result does not depend on how often or to what size the job was resized: the global batch is fixed
(each worker takes WORLD_SIZE-th of it), the data order is fixed by the seed and the epoch, and the
gradients are summed over the whole batch before each step. The optimizer's state is in the checkpoint.
Float64 keeps the sums' different order (with a different number of workers) down to rounding.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from datetime import timedelta

STOP = {"asked": False}


def _ask_stop(signum: int, frame: object) -> None:
    STOP["asked"] = True  # acted on at the next step, when every worker has agreed on it


# Before anything slow (importing torch): a signal during start-up is a request to checkpoint too.
for _name in ("SIGTERM", "SIGUSR1", "SIGINT"):
    signal.signal(getattr(signal, _name), _ask_stop)

import torch  # noqa: E402 - after the signal handlers, on purpose
import torch.distributed as dist  # noqa: E402

try:  # progress reports for the elastic scheduler, when gpufleet is importable; optional
    from gpufleet import runtime
except ImportError:  # pragma: no cover - a job without gpufleet installed
    runtime = None

CHECKPOINT = "checkpoint.pt"
FINAL = "model.pt"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps in all")
    parser.add_argument("--global-batch", type=int, default=16, help="samples per step, over all workers")
    parser.add_argument("--samples", type=int, default=1024, help="size of the (synthetic) data set")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dir", default=".", help="where the checkpoint and the final model go")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to wait per step (demos, tests)")
    args = parser.parse_args(argv)

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if args.global_batch % world:
        print(
            f"the global batch {args.global_batch} does not split over {world} workers; "
            "to fix: give a global batch that every allowed worker count divides",
            file=sys.stderr,
        )
        return 2
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # several workers share the CPUs: one thread each, not one per core each
    torch.manual_seed(args.seed)
    features, targets = make_data(args.samples, args.seed)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    path = os.path.join(args.dir, CHECKPOINT)
    if os.path.exists(path):
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
    resizes = os.environ.get("GPUFLEET_RESIZE_COUNT", "0")
    print(f"rank {rank} of {world}: from step {step} (resize {resizes})", flush=True)

    per_worker = args.global_batch // world
    steps_per_epoch = args.samples // args.global_batch
    stopping = False
    while step < args.steps and not stopping:
        epoch, at = divmod(step, steps_per_epoch)
        order = torch.randperm(args.samples, generator=torch.Generator().manual_seed(args.seed * 7919 + epoch))
        batch = order[at * args.global_batch : (at + 1) * args.global_batch]
        mine = batch[rank * per_worker : (rank + 1) * per_worker]
        optimizer.zero_grad()
        loss_sum = ((model(features[mine]) - targets[mine]) ** 2).sum()
        loss_sum.backward()
        # One collective per step: every gradient, the loss and the stop flag, summed over the workers.
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss_sum.detach().reshape(1), _flag()])
        if world > 1:
            dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g) / args.global_batch)
            offset += g.numel()
        optimizer.step()
        step += 1
        stopping = bool(flat[-1] > 0)
        if rank == 0 and step % 50 == 0:
            loss = float(flat[-2]) / args.global_batch
            print(f"step {step} loss {loss:.6f}", flush=True)
            if runtime is not None:
                runtime.report(step=step, samples=step * args.global_batch, loss=loss)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if rank == 0:
        started = time.monotonic()
        save(path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step})
        if runtime is not None:
            runtime.checkpoint_saved(duration_s=time.monotonic() - started)
        if step >= args.steps:
            save(os.path.join(args.dir, FINAL), model.state_dict())
        print(f"{'stopped' if stopping else 'finished'} at step {step}: checkpoint saved", flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


def _flag() -> torch.Tensor:
    return torch.tensor([1.0 if STOP["asked"] else 0.0], dtype=torch.float64)


def make_data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed synthetic regression set (put your data set here)."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 8, generator=g, dtype=torch.float64)
    targets = torch.sin(features[:, :1] * 2) + 0.5 * features[:, 1:2] * features[:, 2:3]
    return features, targets + 0.05 * torch.randn(samples, 1, generator=g, dtype=torch.float64)


def make_model() -> torch.nn.Module:
    """A small MLP (put your model here)."""
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).double()


def save(path: str, state: object) -> None:
    """Atomically: a worker killed while saving leaves the previous checkpoint whole."""
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
