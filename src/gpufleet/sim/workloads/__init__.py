"""Workload loaders of the simulator, one module per source. Each reads from a path its user gives.

openb       Alibaba openb 2023 (FGD, ATC'23): nodes, pods; `openb_fgd`: the FGD sampling protocol and
            its published results
philly      Microsoft Philly 2017 (Pollux's job table) on Helios' VC-partitioned cluster; Helios results
gavel       Gavel (OSDI'20): throughput table and generated continuous-arrival jobs
pollux      Pollux (OSDI'21): eight 160-job workloads
tiresias    Tiresias (NSDI'19): 60-job trace and cluster specs
synthetic   seeded generator
registry    load_workload(name or path)
"""

from gpufleet.sim.workloads.gavel import load_gavel, load_throughput_table
from gpufleet.sim.workloads.openb import load_openb, load_openb_nodes, load_openb_pods
from gpufleet.sim.workloads.openb_fgd import (
    FgdExpectedResults,
    FgdPoint,
    FgdSeries,
    fgd_sample_pods,
    fgd_workload,
    load_fgd_expected_results,
)
from gpufleet.sim.workloads.philly import HeliosResult, HeliosResults, load_helios_results, load_philly, load_vc_nodes
from gpufleet.sim.workloads.pollux import load_pollux
from gpufleet.sim.workloads.sources import NAMES, detect_format, load_workload
from gpufleet.sim.workloads.synthetic import SyntheticSpec, generate_synthetic
from gpufleet.sim.workloads.tiresias import load_cluster_spec, load_tiresias

__all__ = [
    "NAMES",
    "FgdExpectedResults",
    "FgdPoint",
    "FgdSeries",
    "HeliosResult",
    "HeliosResults",
    "SyntheticSpec",
    "detect_format",
    "fgd_sample_pods",
    "fgd_workload",
    "generate_synthetic",
    "load_cluster_spec",
    "load_fgd_expected_results",
    "load_gavel",
    "load_helios_results",
    "load_openb",
    "load_openb_nodes",
    "load_openb_pods",
    "load_philly",
    "load_pollux",
    "load_throughput_table",
    "load_tiresias",
    "load_vc_nodes",
    "load_workload",
]
