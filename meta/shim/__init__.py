"""What the container runtime execs: a compiled shim (`shim.c`) that forwards the call to
the node daemon, and the thin-mode fallback (`thin.py`) that runs the engine in-process."""
