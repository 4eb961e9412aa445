"""The engine: ADD, DEL, CHECK, STATUS, GC and hot-plug across all of a pod's networks.

One module per verb (add, delete, check, status, gc, hotplug) over `core.py`: the seams
(meta config, cluster source, CNI runtime, node, device source) and the lookups every
verb makes through them.
"""

from __future__ import annotations

from cni.env import CmdArgs
from cni.result import Result
from meta.engine import add, check, delete, gc, hotplug, status
from meta.engine.core import Core


class Engine(Core):
    """One meta config's view of the node: resolve, attach, undo, verify."""

    def add(self, args: CmdArgs) -> Result:
        return add.add(self, args)

    def delete(self, args: CmdArgs) -> None:
        delete.delete(self, args)

    def check(self, args: CmdArgs) -> None:
        check.check(self, args)

    def status(self, args: CmdArgs) -> None:
        status.status(self, args)

    def gc(self, args: CmdArgs) -> None:
        gc.gc(self, args)

    def sync(self, container_id: str) -> bool:
        """Hot-plug: a running container's secondaries follow its pod's annotation."""
        return hotplug.sync(self, container_id)
