"""Generate Python gRPC stubs for every .proto in Plexus's packages (build outputs, not in git).

For `<pkg>/<dir>/<name>.proto` this writes `<name>_pb2.py`, `<name>_pb2.pyi` and
`<name>_pb2_grpc.py` beside it. The proto path given to protoc is relative to the
repository root, so the descriptor is registered as e.g. `meta/podresources/api.proto`
(two protos named `api.proto` can live in one process) and the generated imports are
already absolute (`from meta.podresources import api_pb2`).

Idempotent: a file is regenerated only when its .proto or the grpcio-tools version
changed; the generated files' first line records both. Run with the venv's python.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cni", "meta", "delegates", "deviceplugin")
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _stamp(proto: Path) -> str:
    digest = hashlib.sha256(proto.read_bytes()).hexdigest()
    return f"# plexus-gen: {proto.name} sha256={digest} grpcio-tools={version('grpcio-tools')}\n"


def _outputs(proto: Path) -> list[Path]:
    return [proto.with_name(proto.stem + suffix) for suffix in SUFFIXES]


def _up_to_date(proto: Path, stamp: str) -> bool:
    for out in _outputs(proto):
        try:
            with out.open() as f:
                if f.readline() != stamp:
                    return False
        except OSError:
            return False
    return True


def generate(proto: Path) -> bool:
    """Generate the stubs for one proto; False if they were already current."""
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped]
    except ImportError as exc:
        raise SystemExit(f"gen-protos: grpcio-tools is not installed ({exc})") from exc

    stamp = _stamp(proto)
    if _up_to_date(proto, stamp):
        return False
    rel = proto.relative_to(ROOT)
    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(rel),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"gen-protos: protoc failed on {rel}")
        for out in _outputs(proto):
            text = (Path(tmp) / out.relative_to(ROOT)).read_text()
            fd, partial = tempfile.mkstemp(dir=out.parent, prefix=".gen-")
            with os.fdopen(fd, "w") as f:
                f.write(stamp + text)
            os.replace(partial, out)
    return True


def main() -> int:
    os.chdir(ROOT)
    protos = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.proto"))
    for proto in protos:
        if generate(proto):
            print(f"gen-protos: generated stubs for {proto.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
