from __future__ import annotations

import pytest

from cni.errors import CNIError, ErrorCode


def test_to_dict_includes_details_only_when_set() -> None:
    err = CNIError(ErrorCode.INVALID_CONFIG, "bad config", "missing 'type'")
    assert err.to_dict("1.0.0") == {
        "cniVersion": "1.0.0",
        "code": 7,
        "msg": "bad config",
        "details": "missing 'type'",
    }
    assert CNIError(11, "busy").to_dict("0.4.0") == {
        "cniVersion": "0.4.0",
        "code": 11,
        "msg": "busy",
    }


def test_str_joins_msg_and_details() -> None:
    assert str(CNIError(5, "cannot read", "EIO")) == "cannot read: EIO"
    assert str(CNIError(5, "cannot read")) == "cannot read"


def test_from_dict_round_trip() -> None:
    err = CNIError.from_dict(CNIError(104, "vf busy", "0000:01:10.1").to_dict("1.1.0"))
    assert (err.code, err.msg, err.details) == (104, "vf busy", "0000:01:10.1")
    assert CNIError.from_dict({"code": 3}).msg == ""


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"code": "7"},
        {"code": True},
        {"code": -1},
        {"code": 7, "msg": 1},
        {"code": 7, "details": []},
    ],
)
def test_from_dict_rejects_non_errors(data: dict[str, object]) -> None:
    with pytest.raises(CNIError) as exc:
        CNIError.from_dict(data)
    assert exc.value.code == ErrorCode.DECODE_FAILURE


def test_codes_match_the_spec() -> None:
    assert [int(c) for c in ErrorCode] == [1, 2, 3, 4, 5, 6, 7, 11, 50, 51]
