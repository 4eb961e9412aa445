"""whereabouts-compatible cluster-wide IPAM, served in process by the node daemon.

`config` reads whereabouts' config; `ranges` is its range math and object names;
`objects` the pool objects as read, `pools` keeps them (and the reservations) on the API
server in whereabouts' format, `batches` groups concurrent writes of one pool; `allocator`
allocates and releases across a config's ranges, `slices` gives a node its slice of a
node-slice network, `stock` keeps addresses reserved ahead; `claims` serves IPAMClaims;
`labels` names what Plexus marks; `plugin` is the IPAM as a CNI plugin the daemon's
executor runs in place of the whereabouts binary.
"""
