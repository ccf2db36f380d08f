"""Generate the Python gRPC stubs (`*_pb2.py`, `*_pb2.pyi`, `*_pb2_grpc.py`).

Run with ``make proto``. Output goes to ``zhixi/`` at the repository root, so
the import path equals the proto package (``zhixi.airuntime.job.v1``). The
output is committed; ``make proto-check`` regenerates into a temporary folder
and fails when it differs from what is committed.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_PACKAGE = "zhixi"


def generate(out_dir: Path) -> None:
    """Run protoc over every .proto under ``protos/`` into ``out_dir``."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{wkt}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for folder in (out_dir / OUT_PACKAGE).rglob("*"):
        if folder.is_dir():
            (folder / "__init__.py").touch()
    (out_dir / OUT_PACKAGE / "__init__.py").touch()


def _differences(a: Path, b: Path) -> list[str]:
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    out = [f"only in {cmp.left}: {n}" for n in cmp.left_only]
    out += [f"only in {cmp.right}: {n}" for n in cmp.right_only]
    out += [f"differs: {Path(cmp.left) / n}" for n in cmp.diff_files]
    for sub in cmp.common_dirs:
        out += _differences(a / sub, b / sub)
    return out


def main() -> None:
    """``gen_protos.py`` regenerates; ``gen_protos.py --check`` verifies."""
    if "--check" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            diffs = _differences(ROOT / OUT_PACKAGE, Path(tmp) / OUT_PACKAGE)
        if diffs:
            print("generated stubs are stale; run `make proto`:", *diffs, sep="\n  ")
            raise SystemExit(1)
        print("stubs match protos")
        return
    shutil.rmtree(ROOT / OUT_PACKAGE, ignore_errors=True)
    generate(ROOT)
    print(f"generated {OUT_PACKAGE}/ from {PROTO_ROOT.name}/")


if __name__ == "__main__":
    main()
