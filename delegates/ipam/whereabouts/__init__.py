"""whereabouts-compatible cluster-wide IPAM, served in process by the node daemon.

`config` reads whereabouts' config; `ranges` is its range math and object names; `pools`
keeps IPPools and OverlappingRangeIPReservations on the API server in whereabouts' format;
`allocator` allocates and releases across a config's ranges; `plugin` is the IPAM as a
CNI plugin the daemon's executor runs in place of the whereabouts binary.
"""
