"""Kubernetes: gpufleet as the GPU scheduler of a cluster (its nodes and pods through the API server), and a
real test cluster built from Kubernetes' own sources (`testenv`)."""
