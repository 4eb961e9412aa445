"""The Kubernetes API client shared by the meta-plugin, the device plugins and the cluster IPAM."""
