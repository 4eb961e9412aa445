"""IPAM for the delegate plugins: `dispatch` runs host-local and static in process and
execs anything else; `store` is host-local's on-disk state, which the meta-plugin reads
without loading the plugins."""
