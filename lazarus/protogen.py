"""Generate the Python stubs in ``lazarus/v1`` from ``proto/lazarus/v1/*.proto``.

Theory of operation: ``grpc_tools.protoc`` is run with ``proto/`` as the include
root, so ``proto/lazarus/v1/agent.proto`` becomes ``lazarus/v1/agent_pb2.py``
(+ ``.pyi`` and ``_pb2_grpc.py``) and cross-file imports read
``from lazarus.v1 import records_pb2``. ``make proto`` writes into the
repository; the stale-stubs test writes into a temporary directory and compares.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_DIR = PROTO_ROOT / "lazarus" / "v1"


def proto_files() -> list[Path]:
    """Return the ``.proto`` sources, sorted by name."""
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_root: Path) -> list[Path]:
    """Generate stubs for every proto file under ``out_root/lazarus/v1``.

    Args:
        out_root: directory that receives ``lazarus/v1/*_pb2*.py[i]``.

    Returns:
        The generated files, sorted.

    Raises:
        RuntimeError: protoc reported an error (its message is included).
    """
    from grpc_tools import protoc

    out_dir = out_root / "lazarus" / "v1"
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(str(p) for p in proto_files()),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
    init = out_dir / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated wire stubs. Regenerate with `make proto`."""\n')
    return sorted(p for p in out_dir.iterdir() if p.name != "__init__.py" and p.is_file())


def main() -> int:
    files = generate(REPO_ROOT)
    for f in files:
        print(f.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
