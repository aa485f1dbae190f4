"""Ops and their isolated cost, op graphs, workload generators and schedules."""
