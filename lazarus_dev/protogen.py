"""Generate the Python stubs in ``lazarus/v1`` from ``proto/lazarus/v1/*.proto``.

Theory of operation: ``grpc_tools.protoc`` is run with ``proto/`` as the include
root, so ``proto/lazarus/v1/agent.proto`` becomes ``lazarus/v1/agent_pb2.py``
(+ ``.pyi`` and ``_pb2_grpc.py``) and cross-file imports read
``from lazarus.v1 import records_pb2``. protoc writes into a scratch directory
first; only then are the files copied to ``out_root/lazarus/v1`` and generated
files whose proto is gone removed, so a failed run never leaves half a set.
``make proto`` writes into the repository; the stale-stubs test writes into a
temporary directory and compares. ``descriptor_set`` compiles the same sources
with their comments (``SourceCodeInfo``) for the contract tests.
"""

from __future__ import annotations

import sys
import tempfile
from importlib import resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "proto"
PROTO_DIR = PROTO_ROOT / "lazarus" / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
INIT_TEXT = '"""Generated wire stubs. Regenerate with `make proto`."""\n'


def proto_files() -> list[Path]:
    """Return the ``.proto`` sources, sorted by name.

    Returns:
        Absolute paths of ``proto/lazarus/v1/*.proto``.
    """
    return sorted(PROTO_DIR.glob("*.proto"))


def is_generated(path: Path) -> bool:
    """Tell whether ``path`` names a file this generator writes.

    Args:
        path: any file path.

    Returns:
        True for ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py``.
    """
    return path.name.endswith(GENERATED_SUFFIXES)


def _run_protoc(extra_args: list[str]) -> None:
    """Run ``grpc_tools.protoc`` over every proto file.

    Args:
        extra_args: output options, e.g. ``["--python_out=/tmp/x"]``.

    Raises:
        RuntimeError: protoc reported an error (the command line is included;
            protoc's own diagnostics go to stderr).
    """
    from grpc_tools import protoc

    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        *extra_args,
        *(str(p) for p in proto_files()),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")


def generate(out_root: Path) -> list[Path]:
    """Generate stubs for every proto file under ``out_root/lazarus/v1``.

    Files are rewritten only when their content changes; generated files with no
    proto left are deleted; ``__init__.py`` is created when missing and never
    overwritten.

    Args:
        out_root: directory that receives ``lazarus/v1/*_pb2*.py[i]``.

    Returns:
        The generated files under ``out_root/lazarus/v1``, sorted.

    Raises:
        RuntimeError: protoc reported an error (its message is included);
            ``out_root`` is left untouched.
    """
    out_dir = out_root / "lazarus" / "v1"
    with tempfile.TemporaryDirectory(prefix="lazarus-protogen-") as scratch:
        scratch_root = Path(scratch)
        _run_protoc(
            [
                f"--python_out={scratch_root}",
                f"--pyi_out={scratch_root}",
                f"--grpc_python_out={scratch_root}",
            ]
        )
        fresh = {
            p.name: p.read_bytes()
            for p in (scratch_root / "lazarus" / "v1").iterdir()
            if p.is_file() and is_generated(p)
        }
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.iterdir():
        if old.is_file() and is_generated(old) and old.name not in fresh:
            old.unlink()
    for name, data in sorted(fresh.items()):
        target = out_dir / name
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
    init = out_dir / "__init__.py"
    if not init.exists():
        init.write_text(INIT_TEXT)
    return sorted(out_dir / name for name in fresh)


def descriptor_set(out_file: Path) -> bytes:
    """Compile every proto file, with comments, into a serialized FileDescriptorSet.

    Args:
        out_file: where protoc writes the set (``--descriptor_set_out``).

    Returns:
        The serialized ``google.protobuf.FileDescriptorSet``: one
        ``FileDescriptorProto`` per proto file (imports not included), each with
        its ``SourceCodeInfo`` (locations and leading comments).

    Raises:
        RuntimeError: protoc reported an error.
    """
    out_file.parent.mkdir(parents=True, exist_ok=True)
    _run_protoc(["--include_source_info", f"--descriptor_set_out={out_file}"])
    return out_file.read_bytes()


def main() -> int:
    """Regenerate the committed stubs in the repository (``make proto``).

    Returns:
        The process exit code, 0 on success.

    Raises:
        RuntimeError: protoc reported an error.
    """
    files = generate(REPO_ROOT)
    for f in files:
        print(f.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
