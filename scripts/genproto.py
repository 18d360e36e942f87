"""Regenerate the Python code for the wire contract in protos/ (the one command for it).

`python scripts/genproto.py` writes cgsvc/v1/*_pb2.py, *_pb2.pyi and *_pb2_grpc.py(i).
`python scripts/genproto.py --check` regenerates into a temporary folder and fails when
the committed code differs, so CI catches a proto edit without a regeneration.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = Path("cgsvc") / "v1"
INIT_TEXT = '"""Generated wire contract of cgsvc.v1; regenerate with `make protos`."""\n'


def generate(out_dir: Path) -> None:
    """Run protoc over every proto file, writing the package under out_dir."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    plugin = Path(sysconfig.get_path("scripts")) / "protoc-gen-mypy_grpc"
    if not plugin.exists():
        plugin = Path(sys.executable).parent / "protoc-gen-mypy_grpc"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{wkt}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy_grpc={plugin}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    (out_dir / PACKAGE_DIR / "__init__.py").write_text(INIT_TEXT)
    (out_dir / "cgsvc" / "__init__.py").unlink(missing_ok=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when generated code is stale")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        fresh = out / PACKAGE_DIR
        target = ROOT / PACKAGE_DIR
        if ns.check:
            names = sorted(p.name for p in fresh.iterdir())
            present = sorted(p.name for p in target.iterdir() if p.is_file()) if target.exists() else []
            match, mismatch, errors = filecmp.cmpfiles(fresh, target, names, shallow=False)
            extra = [n for n in present if n not in names]
            if mismatch or errors or extra:
                print(f"generated code in {PACKAGE_DIR} is stale: {mismatch + errors + extra}; run `make protos`")
                return 1
            print(f"generated code in {PACKAGE_DIR} is fresh ({len(match)} files)")
            return 0
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(fresh, target)
        print(f"wrote {PACKAGE_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
