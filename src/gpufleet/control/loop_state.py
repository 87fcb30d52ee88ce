"""The working state a control loop keeps between cycles, and how each cycle gets its own.

Rebuilding the core's working state from every running job each step would cost as much as a small cycle.
Instead the loop keeps one `CycleState` in step with the store (`add_running`, `remove_running`,
`set_evicting`) and `fork`s it for each cycle: a step costs what changed. A test checks that this state
equals one built from the store.

After a cycle, the state keeps the fork's filter evaluations and kept scores (`keep_from`, the most recently
used `KEPT_EVALUATIONS`), so the next fork re-filters and re-scores only the nodes changed since. The node
inventory's table, capacity memo and running-job facts are cached in an `InventoryCache` the loop owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from gpufleet.domain.jobs import JobId, RunningJob
from gpufleet.domain.quotas import QueueSpec
from gpufleet.domain.snapshot import ClusterSnapshot
from gpufleet.domain.throughput_table import ThroughputTable
from gpufleet.scheduling.plugin_api import ClusterView, Holding, RunEstimate
from gpufleet.scheduling.state import CycleState, InventoryCache
from gpufleet.scheduling.table import NodeTable

# Evaluations kept between cycles (the most recently used filter classes).
KEPT_EVALUATIONS = 256


class LoopState:
    """The loop's working state: equal to a state built from the store's snapshot, forked for each cycle.

    `estimates`: what the profile's learner predicted for pending jobs (the loop's own mapping, read by every
    fork as data). Observers (metrics, the simulator's recorder) read `table`, `holdings` and `evicting`."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        inventory: InventoryCache,
        estimates: Mapping[JobId, RunEstimate],
        throughput: ThroughputTable | None = None,
    ) -> None:
        self.inventory = inventory
        self.state = CycleState(snapshot, inventory, estimates, throughput)
        self._fork: CycleState | None = None
        self._view: ClusterView | None = None
        self._forked_at = 0  # the state's table clock when the last fork was made

    # --- what observers and the loop read -------------------------------------------------------------

    @property
    def view(self) -> ClusterView:
        """The state as plugins see it (the loop keys jobs that become pending against it)."""
        view = self.state.view
        self._view = view  # the state refers to its view weakly: held here, the next call gets the same one
        return view

    @property
    def table(self) -> NodeTable:
        return self.state.table

    @property
    def holdings(self) -> Mapping[JobId, Holding]:
        return self.state.holdings

    @property
    def evicting(self) -> AbstractSet[JobId]:
        return self.state.evicting

    @property
    def queues(self) -> Mapping[str, QueueSpec]:
        return self.state.ledger.queues

    # --- kept in step with the store ------------------------------------------------------------------

    def set_now(self, now: float) -> None:
        """The time of the loop's step (plugins keying jobs against this state read it)."""
        self.state.now = now

    def add_running(self, running: RunningJob) -> None:
        self.state.add_running(running)

    def remove_running(self, job_id: JobId) -> None:
        self.state.remove_running(job_id)

    def set_evicting(self, job_id: JobId, for_job: JobId) -> None:
        self.state.set_evicting(job_id, for_job)

    def set_checkpoint(self, job_id: JobId, at: float) -> None:
        self.state.set_checkpoint(job_id, at)

    def set_throughput(self, table: ThroughputTable | None) -> None:
        """The measured throughput table cycles read from now on. Scores depend on it, so no evaluation made with
        the previous one is kept."""
        self.state.throughput = table
        self.state.evaluations.clear()
        self._fork = None

    # --- one cycle ----------------------------------------------------------------------------------

    def fork(self, now: float) -> CycleState:
        """An independent working copy for one cycle at time `now`; decide on it before this state changes."""
        self._fork = self.state.copy(now)
        self._forked_at = self.state.table.clock
        return self._fork

    def keep_from(self, fork: CycleState) -> None:
        """Keep a finished fork's evaluations for the next forks.

        They were computed on the fork's table. Every node the fork changed (placements, held room, what-ifs
        undone) is marked changed here too, and each evaluation is dated back to when the fork was made: any
        node changed in the fork or in this state since then is then refreshed before it is read again, so
        the next fork reads what a fresh evaluation gives. Only the latest fork is kept from."""
        if fork is not self._fork:
            return
        forked_at = self._forked_at
        self.state.table.mark_changed((fork.table.version > forked_at).nonzero()[0])
        kept = self.state.evaluations
        for key, entry in fork.evaluations.items():
            entry.clock = min(entry.clock, forked_at)
            entry.scores_clock = min(entry.scores_clock, forked_at)
            kept.pop(key, None)
            kept[key] = entry  # the most recently used last
        while len(kept) > KEPT_EVALUATIONS:
            del kept[next(iter(kept))]
