"""One home for the storage layout (issue 18 item 5).

The coordinator does not import the node agent (both import ``lazarus.storage``),
and no Redis key is spelled outside ``lazarus/storage/keys.py``: a key written
in two places drifts (``api.py`` once read forks under a prefix-less key).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("coordinator", "node_agent", "reconcile", "lazarus")
# A Redis key: "lazarus:" or "{prefix}:" followed by a hash tag or a known segment.
KEY_LITERAL = re.compile(r"(lazarus|\{prefix\}|\{self\.prefix\}):(\{\{|doc:|archive:)")


def _sources(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py") if "/v1/" not in str(p))


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_coordinator_does_not_import_the_node_agent() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in _imported_modules(path) if m.startswith("node_agent")
        )
        for path in _sources("coordinator")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_storage_depends_on_neither_side() -> None:
    for path in _sources("lazarus/storage"):
        bad = [
            m for m in _imported_modules(path) if m.split(".")[0] in ("coordinator", "node_agent")
        ]
        assert bad == [], (path, bad)


def test_every_redis_key_is_built_in_one_module() -> None:
    keys_module = ROOT / "lazarus" / "storage" / "keys.py"
    found = []
    for path in _sources(*PRODUCT):
        if path == keys_module:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            # f-strings: the literal parts joined with {} where a value goes.
            if isinstance(node, ast.JoinedStr):
                text = "".join(
                    v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                    for v in node.values
                    if isinstance(v, ast.Constant | ast.FormattedValue)
                )
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if KEY_LITERAL.search(text) and not _is_docstring_like(text):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text[:60]!r}")
    assert found == [], "\n".join(found)


def _is_docstring_like(text: str) -> bool:
    return "\n" in text or "``" in text


def test_the_key_check_sees_an_inline_key() -> None:
    """The check itself can fail: the spelling api.py once had is caught."""
    node = ast.parse('key = f"lazarus:{{{task_id}}}:forks"').body[0].value  # type: ignore[attr-defined]
    text = "".join(
        v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
        for v in node.values
    )
    assert KEY_LITERAL.search(text)
