"""Hardware (MAC) addresses a pod's interface may be given: a station's own, unicast.

The kernel refuses a multicast or all-zero address on an Ethernet link (EADDRNOTAVAIL,
which a plugin would pass on as code 999), so tenant input that asks for one is refused
before any link is touched.
"""

from __future__ import annotations

import string

_HEX = frozenset(string.hexdigits)
_IPOIB_BYTES = 20  # an IPoIB address: queue pair number and GID, no group bit to check


def station_problem(text: str) -> str | None:
    """Why the hardware address `text` (its notation already checked: Go's net.ParseMAC
    forms) can never be a unicast station address, or None."""
    digits = bytes.fromhex("".join(c for c in text if c in _HEX))
    if len(digits) == _IPOIB_BYTES:
        return None
    if not any(digits):
        return f'"{text}" is all zeros: not a station address'
    if all(b == 0xFF for b in digits):
        return f'"{text}" is the broadcast address: not a station address'
    if digits[0] & 1:
        return f'"{text}" is a multicast address (its first octet is odd): not a station address'
    return None
