"""Bounded decoding of untrusted JSON."""

from __future__ import annotations

import json
import sys
import threading

import pytest

from cni import jsonio
from cni.errors import CNIError, ErrorCode


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _error(data: bytes | str, **kwargs: int) -> CNIError:
    with pytest.raises(CNIError) as caught:
        jsonio.loads(data, "the thing", **kwargs)
    assert caught.value.code == ErrorCode.DECODE_FAILURE
    return caught.value


def test_ordinary_documents_decode_as_json_does() -> None:
    doc = {"a": [1, {"b": None}], "c": "[[[[{{{{", "d": 1.5}
    text = json.dumps(doc)
    assert jsonio.loads(text, "x") == jsonio.loads(text.encode(), "x") == doc
    assert jsonio.loads(_nested(jsonio.MAX_DEPTH), "x") is not None


@pytest.mark.parametrize("depth", [jsonio.MAX_DEPTH + 1, 999, 100_000])
def test_too_deep_is_code_6_naming_the_document(depth: int) -> None:
    assert _error(_nested(depth)).msg == "the thing is nested deeper than 64 levels"


def test_objects_count_as_levels_too() -> None:
    deep = '{"k":' * 65 + "1" + "}" * 65
    assert "nested deeper" in _error(deep).msg
    # Brackets inside strings are no nesting at all.
    assert jsonio.loads(json.dumps({"s": "[" * 10_000}), "x") == {"s": "[" * 10_000}


def test_deep_nesting_in_a_worker_thread_kills_nothing() -> None:
    """A daemon worker thread survives: the error is a CNIError, not a RecursionError."""
    errors: list[BaseException] = []

    def work() -> None:
        try:
            jsonio.loads(_nested(100_000), "stdin")
        except BaseException as exc:  # whatever escapes, even a RecursionError
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert [type(e) for e in errors] == [jsonio.DecodeError]
    assert isinstance(errors[0], CNIError)
    assert sys.getrecursionlimit() >= 1000


def test_size_and_syntax_errors() -> None:
    assert _error(b"[" + b" " * 20 + b"]", max_bytes=16).msg == (
        "the thing is too large: 22 bytes, at most 16 are accepted"
    )
    assert _error("{nope").msg.startswith("the thing: invalid JSON at line 1 column 2: ")
    assert _error(b"\xff\xfe\xfd").msg.startswith("the thing: invalid JSON")


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32-le"])
def test_depth_is_measured_the_same_in_every_encoding_json_accepts(encoding: str) -> None:
    shallow = json.dumps({"a": ['"[[\\"', {"b": [[]]}]} | {str(i): [] for i in range(70)})
    deep = '{"s": "]]]]\\"}}", "k": ' + _nested(65) + "}"
    assert jsonio.loads(shallow.encode(encoding), "x")["a"][0] == '"[[\\"'
    assert "nested deeper" in _error(deep.encode(encoding)).msg


@pytest.mark.parametrize("data", ["{", "x" * 20, _nested(jsonio.MAX_DEPTH + 1)])
def test_every_refusal_is_a_value_error_as_json_loads_raises(data: str) -> None:
    """So a caller that caught json.loads's ValueError still catches it."""
    with pytest.raises(ValueError, match="the thing"):
        jsonio.loads(data, "the thing", max_bytes=10 if data.startswith("x") else 1000)
