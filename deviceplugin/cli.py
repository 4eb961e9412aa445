"""`plexus deviceplugin ...`: inspect what the device plugin would offer."""

from __future__ import annotations

import json
import sys

from deviceplugin.config import ConfigError, load_config
from deviceplugin.selectors import pools_report
from deviceplugin.sysfs import DEFAULT_SYSFS, default_route_ifaces, discover


def list_pools(config_file: str, sysfs_root: str = DEFAULT_SYSFS) -> int:
    """Print the resource pools as JSON; config errors are one line on stderr, exit 2."""
    try:
        config = load_config(config_file)
    except ConfigError as exc:
        print(f"plexus deviceplugin: {exc}", file=sys.stderr)
        return 2
    devices = discover(sysfs_root, default_route_ifaces())
    print(json.dumps(pools_report(config, devices), indent=2))
    return 0
