"""host-local's config reading: what is kept per config, and what each call reads anew."""

from __future__ import annotations

from ipaddress import ip_address
from typing import Any

import pytest

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from delegates.ipam.host_local import load_config


def conf(**ipam: Any) -> dict[str, Any]:
    body = {"type": "host-local", "ranges": [[{"subnet": "10.1.0.0/24"}]], **ipam}
    return {"cniVersion": "1.0.0", "name": "net", "type": "macvlan", "ipam": body}


def args(cni_args: tuple[tuple[str, str], ...] = ()) -> CmdArgs:
    return CmdArgs("ADD", "c1", "/run/netns/p", "net1", cni_args, (), b"")


def test_each_call_reads_its_own_cni_args() -> None:
    """One config, parsed once: the IP= of one call must not reach the next."""
    asked = load_config(conf(), args((("IP", "10.1.0.9"),)))
    plain = load_config(conf(), args())
    assert asked.requested == [ip_address("10.1.0.9")]
    assert plain.requested == []
    assert asked.range_sets == plain.range_sets


def test_a_changed_config_is_read_again() -> None:
    first = load_config(conf(), args())
    second = load_config(conf(ranges=[[{"subnet": "10.2.0.0/24"}]]), args())
    assert str(first.range_sets[0][0].subnet) == "10.1.0.0/24"
    assert str(second.range_sets[0][0].subnet) == "10.2.0.0/24"


def test_a_bad_range_fails_every_call_after_cni_args_are_checked() -> None:
    bad = conf(ranges=[[{"subnet": "10.1.0.0/24", "rangeStart": "10.9.0.1"}]])
    for _ in range(2):  # kept or not, the error comes every time
        with pytest.raises(CNIError) as exc:
            load_config(bad, args())
        assert exc.value.code == ErrorCode.INVALID_CONFIG
        assert exc.value.msg.startswith("invalid range set 0")
    with pytest.raises(CNIError) as exc:
        load_config(bad, args((("IP", "nonsense"),)))
    assert "invalid range set" not in exc.value.msg  # CNI_ARGS first, as the reference
