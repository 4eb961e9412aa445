"""The node daemon: hosts the engine warm and serves the shim over a unix socket."""
