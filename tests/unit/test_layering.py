"""The layering rules of docs/architecture.md, checked on the source tree's import graph.

- only ``serving/`` imports runpod, rq and web frameworks, only ``storage/`` imports boto3/botocore;
- kernels import no voxcast code but their own (and errors);
- models import nothing from the engine, the service, serving, prerendering, storage or caches;
- nothing outside ``models/`` (and the test checkpoints of ``testing/``) imports a concrete model family (only ``models.base``, ``models.registry``
  and ``models.hub``);
- production code does not import ``voxcast.testing`` (only the ``make-test-model`` command does);
- ``integrations/`` (agent-framework plug-ins) import no voxcast code: they talk to a server;
- no import cycle among the modules of ``src/``, counting the imports under ``if TYPE_CHECKING:`` too
  (a cycle that only type checkers see still ties two modules into one: neither reads or changes
  without the other).

Every import counts, including those inside functions and those only type checkers run. The checker is tested on a made-up tree too,
so that a broken checker cannot pass the real one silently.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "voxcast"
FORBIDDEN = ("runpod", "rq", "boto3", "botocore", "redis", "fastapi", "starlette", "uvicorn")

#: Packages (under voxcast.) a model may import.
MODEL_MAY_IMPORT = ("voxcast.models", "voxcast.kernels", "voxcast.errors", "voxcast.audio", "voxcast.lru")
#: What of voxcast.models everything outside it may import.
MODEL_API = (
    "voxcast.models.base",
    "voxcast.models.sampling",
    "voxcast.models.registry",
    "voxcast.models.hub",
    "voxcast.models",
)


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``root``'s package it imports (anywhere, ``if TYPE_CHECKING:`` included)."""
    modules = {_module_name(root, p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                candidates = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            else:
                continue
            found.update(c for c in candidates if c in modules and c != name)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that break the layer rules (module docstring)."""
    bad = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            if module.startswith("voxcast.kernels") and not target.startswith(
                ("voxcast.kernels", "voxcast.errors")
            ):
                bad.append(f"{module} -> {target} (kernels import no model or engine code)")
            if module.startswith("voxcast.models.") and not target.startswith(MODEL_MAY_IMPORT):
                bad.append(f"{module} -> {target} (models import no engine/service/serving code)")
            if (
                not module.startswith(("voxcast.models", "voxcast.testing"))
                and target.startswith("voxcast.models.")
                and target not in MODEL_API
            ):
                bad.append(f"{module} -> {target} (only models.base/registry/hub outside models/)")
            if (
                target.startswith("voxcast.testing")
                and not module.startswith("voxcast.testing")
                and module != "voxcast.serving.cli.testmodel"
            ):
                bad.append(f"{module} -> {target} (production code imports no test checkpoints)")
            if module.startswith("voxcast.integrations") and not target.startswith("voxcast.integrations"):
                bad.append(f"{module} -> {target} (integrations talk to a server, import no voxcast code)")
    return bad


def test_src_has_no_import_cycle() -> None:
    assert cycles(import_graph(SRC)) == []


def test_layer_rules_hold() -> None:
    assert violations(import_graph(SRC)) == []


def test_the_checker_finds_cycles_and_violations(tmp_path: Path) -> None:
    root = tmp_path / "voxcast"
    for rel, text in {
        "__init__.py": "",
        "engine/__init__.py": "",
        "engine/a.py": "from voxcast.models.fam.model import M\n",
        "models/__init__.py": "",
        "models/fam/__init__.py": "",
        "models/fam/model.py": "def f():\n    from voxcast.engine import a\n",
        "models/fam/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import y\n",
        "models/fam/y.py": "from . import x\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    graph = import_graph(root)
    assert cycles(graph) == [  # x <-> y only under TYPE_CHECKING: still a cycle
        ["voxcast.engine.a", "voxcast.models.fam.model"],
        ["voxcast.models.fam.x", "voxcast.models.fam.y"],
    ]
    assert violations(graph) == [
        "voxcast.engine.a -> voxcast.models.fam.model (only models.base/registry/hub outside models/)",
        "voxcast.models.fam.model -> voxcast.engine (models import no engine/service/serving code)",
        "voxcast.models.fam.model -> voxcast.engine.a (models import no engine/service/serving code)",
    ]


def test_engine_and_models_import_no_serving_library() -> None:
    code = (
        "import sys, voxcast.engine.engine, voxcast.engine.warmup, voxcast.models.qwen3_tts.model\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_only_serving_imports_runpod_rq_and_web_frameworks_only_storage_imports_boto3() -> None:
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
        roots = {name.split(".")[0] for name in names}
        serving_libs = roots & {"runpod", "rq", "fastapi", "starlette", "uvicorn", "websockets", "pipecat"}
        if serving_libs:
            assert rel.startswith(("serving/", "integrations/")), f"{rel} imports {serving_libs}"
        if roots & {"boto3", "botocore"}:
            assert rel.startswith("storage/"), f"{rel} imports boto3"
