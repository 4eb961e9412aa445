"""Cluster tier: tests against a real etcd + kube-apiserver started on loopback."""
