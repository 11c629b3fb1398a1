"""Regenerate the Python stubs in baton/v1 from protos/ (the only source of truth).

Usage: python scripts/gen_protos.py [--check]
With --check, regenerate into a temp dir and exit 1 when the committed stubs differ.
"""
from __future__ import annotations

import filecmp
import os
import pathlib
import shutil
import sys
import tempfile

from grpc_tools import protoc
import grpc_tools

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT_PKG = ("baton", "v1")


def generate(out_root: pathlib.Path) -> list[pathlib.Path]:
    # protoc-gen-mypy lives beside the interpreter (the venv's bin/).
    os.environ["PATH"] = f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"-I{include}",
            f"--python_out={out_root}",
            f"--grpc_python_out={out_root}",
            f"--mypy_out={out_root}",
            *files,
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    return sorted((out_root.joinpath(*OUT_PKG)).glob("*_pb2*.py*"))


def main() -> int:
    check = "--check" in sys.argv[1:]
    target = ROOT.joinpath(*OUT_PKG)
    with tempfile.TemporaryDirectory() as tmp:
        produced = generate(pathlib.Path(tmp))
        names = {p.name for p in produced}
        existing = {p.name for p in target.glob("*_pb2*.py*")}
        if check:
            stale = sorted(
                n for n in names | existing
                if n not in names or n not in existing
                or not filecmp.cmp(target / n, pathlib.Path(tmp).joinpath(*OUT_PKG, n), shallow=False)
            )
            if stale:
                print("generated stubs are stale; run `make protos`:", ", ".join(stale))
                return 1
            print("generated stubs are up to date")
            return 0
        for n in existing - names:
            (target / n).unlink()
        for p in produced:
            shutil.copyfile(p, target / p.name)
        print(f"wrote {len(produced)} files to {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
