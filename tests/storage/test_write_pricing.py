"""The loop's write prices each attempt that starts holding GPUs from the nodes stored at that moment (SQLite and
PostgreSQL), in the same transaction: a node changed between two starts prices the later one as it now is."""

from __future__ import annotations

from gpufleet.domain import JobState as S
from gpufleet.domain import make_node
from gpufleet.domain.cluster import GpuShare, WorkerPlacement
from gpufleet.domain.costs import Charge, Pool, Price
from tests.storage.conftest import Harness
from tests.storage.test_contract import job, move


def test_each_start_is_priced_from_the_nodes_stored_when_it_starts(sql: Harness) -> None:
    store = sql.sql
    store.set_prices(
        [Price("A100-80GB", Pool.ON_DEMAND, 2.0, "test"), Price("H100", Pool.ON_DEMAND, 5.0, "test")], at=0.0
    )
    sql.set_cluster(nodes=[make_node("n1", "A100-80GB", 8, 80 << 30), make_node("n2", "H100", 8, 80 << 30)])
    two_gpus = (WorkerPlacement("n1", (GpuShare(0), GpuShare(1))),)
    a = store.submit(job("a"), at=1.0)
    b = store.submit(job("b"), at=1.0)
    (a_expected, a_started), a_start = move(a, S.ADMITTED, 2.0, attempt=1, workers=two_gpus, started_at=2.0)
    on_n2 = (WorkerPlacement("n2", (GpuShare(3, 500),)),)
    (b_expected, b_started), b_start = move(b, S.ADMITTED, 2.0, attempt=1, workers=on_n2, started_at=2.0)
    store.write([(a_expected, a_started), (b_expected, b_started)], [a_start, b_start])

    # n1 is replaced by a node of the same name with other GPUs; a job started after that is priced on them.
    sql.set_cluster(nodes=[make_node("n1", "H100", 8, 80 << 30), make_node("n2", "H100", 8, 80 << 30)])
    c = store.submit(job("c"), at=3.0)
    (c_expected, c_started), c_start = move(c, S.ADMITTED, 4.0, attempt=1, workers=two_gpus, started_at=4.0)
    # A job's second attempt, in a later write, is a second charge.
    (a_expected, a_stopped), a_stop = move(a_started, S.PENDING, 4.0, workers=())
    store.write([(c_expected, c_started), (a_expected, a_stopped)], [c_start, a_stop])
    (a_expected, a_again), a_restart = move(a_stopped, S.ADMITTED, 5.0, attempt=2, workers=on_n2, started_at=5.0)
    store.write([(a_expected, a_again)], [a_restart])

    charges = store.charges(["a", "b", "c"])
    assert charges["a"] == {
        2.0: (Charge("A100-80GB", Pool.ON_DEMAND, 2.0, 2.0),),
        5.0: (Charge("H100", Pool.ON_DEMAND, 0.5, 5.0),),
    }
    assert charges["b"] == {2.0: (Charge("H100", Pool.ON_DEMAND, 0.5, 5.0),)}
    assert charges["c"] == {4.0: (Charge("H100", Pool.ON_DEMAND, 2.0, 5.0),)}
    # Another store on the same database (another process) changes a node: this store's next write sees it.
    sql.open_another().set_nodes([make_node("n1", "A100-80GB", 8, 80 << 30), make_node("n2", "H100", 8, 80 << 30)])
    d = store.submit(job("d"), at=6.0)
    (d_expected, d_started), d_start = move(d, S.ADMITTED, 7.0, attempt=1, workers=two_gpus, started_at=7.0)
    store.write([(d_expected, d_started)], [d_start])
    assert store.charges(["d"])["d"] == {7.0: (Charge("A100-80GB", Pool.ON_DEMAND, 2.0, 2.0),)}
