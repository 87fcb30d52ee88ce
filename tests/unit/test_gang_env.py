"""The environment the allocator gives a gang's workers, for any placement over several nodes: what
`torchrun` and plain `torch.distributed` need, consistent across ranks (a property test)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.adapters.local.worker_env import allocator_env
from gpufleet.domain import make_node
from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.ports import Launch
from tests.kit.builders import make_job

NODES = {f"n{i}": make_node(f"n{i}", "A100-80GB", 8, 80 << 30) for i in range(4)}
ADDRESSES = {name: f"10.0.0.{i + 1}" for i, name in enumerate(NODES)}


@st.composite
def gangs(draw: st.DrawFn) -> tuple[WorkerPlacement, ...]:
    """Workers of 1, 2, 4 or 8 GPUs on up to 4 nodes, each GPU used once."""
    per_worker = draw(st.sampled_from([1, 2, 4, 8]))
    free = {name: list(range(8)) for name in NODES}
    workers = []
    for _ in range(draw(st.integers(1, 32 // per_worker))):
        name = draw(st.sampled_from([n for n, gpus in free.items() if len(gpus) >= per_worker]))
        taken, free[name] = free[name][:per_worker], free[name][per_worker:]
        workers.append(WorkerPlacement(name, tuple(GpuShare(i) for i in taken)))
    return tuple(workers)


@settings(max_examples=200, deadline=None)
@given(gangs())
def test_every_rank_of_a_gang_agrees_on_the_rendezvous_and_its_place(workers: tuple[WorkerPlacement, ...]) -> None:
    job = make_job("g").gpus(len(workers[0].gpus)).workers(len(workers)).build()
    launch = Launch(job, 1, workers)
    envs = [
        allocator_env(
            launch, rank, NODES, master_addr=ADDRESSES[workers[0].node], master_port=29500,
            emulated=False, node_addresses=ADDRESSES,
        )
        for rank in range(len(workers))
    ]  # fmt: skip
    order = list(dict.fromkeys(w.node for w in workers))
    assert {e["MASTER_ADDR"] for e in envs} == {ADDRESSES[workers[0].node]}  # rank 0's node
    assert {e["GPUFLEET_NODE_IPS"] for e in envs} == {"\n".join(ADDRESSES[n] for n in order)}
    assert [int(e["RANK"]) for e in envs] == list(range(len(workers)))
    assert {e["WORLD_SIZE"] for e in envs} == {str(len(workers))}
    assert envs[0]["NODE_RANK"] == "0"
    for name in order:
        here = [e for e, w in zip(envs, workers, strict=True) if w.node == name]
        assert {e["NODE_RANK"] for e in here} == {str(order.index(name))}
        assert sorted(int(e["LOCAL_RANK"]) for e in here) == list(range(len(here)))
        assert {e["LOCAL_WORLD_SIZE"] for e in here} == {str(len(here))}
        visible = [g for e in here for g in e["CUDA_VISIBLE_DEVICES"].split(",")]
        assert len(visible) == len(set(visible))  # no GPU given to two ranks of the node
        assert all(g.startswith(f"GPU-{name}-") for g in visible)  # and only the node's own
