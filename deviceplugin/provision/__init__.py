"""SR-IOV provisioning: the sriov-network-operator's policies applied by the device plugin.

crs.py (the custom resources) -> merge.py (policies -> the PFs' desired config) -> plan.py
(against sysfs) -> host.py (the writes) with record.py (what Plexus made); pools.py feeds the
device plugin; holders.py, evict.py and leases.py decide and bound disruption; agent.py runs it.
"""
