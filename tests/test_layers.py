"""The package's layers, checked on the import graph (lazy imports inside functions included).

    core (sparkpriv.privacy, sparkpriv.mechanisms, errors, _validation; no pyspark)
      <- engines (sparkpriv.spark, sparkpriv.local)
      <- release, api, estimators, ledger, io, config
      <- cli, runner, demo, bench, jobs/

An import may only go to the same or a lower layer, and sparkpriv.privacy may not
import sparkpriv.mechanisms. KNOWN lists imports allowed to run the wrong way; it is
empty since every mechanism is on the one release path, and an entry that no longer
occurs fails, so it can only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = [  # (module prefix, layer); longest prefix wins
    ("sparkpriv._version", 0), ("sparkpriv.errors", 0), ("sparkpriv._validation", 0),
    ("sparkpriv.privacy", 0), ("sparkpriv.mechanisms", 0),
    ("sparkpriv.spark", 1), ("sparkpriv.local", 1),
    ("sparkpriv.release", 2), ("sparkpriv.api", 2), ("sparkpriv.estimators", 2), ("sparkpriv.ledger", 2), ("sparkpriv.io", 2), ("sparkpriv.config", 2),
    ("sparkpriv.cli", 3), ("sparkpriv.runner", 3), ("sparkpriv.demo", 3), ("sparkpriv.bench", 3),
    ("jobs", 3),
]
NAMES = {0: "core", 1: "engines", 2: "release/ledger/io", 3: "cli/jobs"}

# (importing module, imported module): wrong-way imports still present
KNOWN: set = set()


def layer(module: str) -> int | None:
    best = None
    for prefix, lay in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, lay)
    return None if best is None else best[1]


def modules():
    for path in sorted((ROOT / "sparkpriv").rglob("*.py")) + sorted((ROOT / "jobs").glob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        yield ".".join(parts), is_pkg, path


def imports(module: str, is_pkg: bool, path: Path):
    """Every module ``module`` imports (absolute names), at any depth of the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = base[: len(base) - (node.level - 1)]
                name = ".".join(pkg + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield name
            for a in node.names:  # "from sparkpriv.spark import kmeans" imports sparkpriv.spark.kmeans
                yield f"{name}.{a.name}"


def resolve(name: str, known: set[str]) -> str | None:
    """The sparkpriv module (or package) ``name`` refers to, or None for outside names."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def edges():
    mods = list(modules())
    known = {m for m, _, _ in mods}
    for mod, is_pkg, path in mods:
        for name in imports(mod, is_pkg, path):
            if name.split(".")[0] == "pyspark":
                yield mod, "pyspark"
                continue
            target = resolve(name, known)
            if target is not None and target != mod:
                yield mod, target


def test_imports_follow_the_layers():
    wrong, seen_known = set(), set()
    for src, dst in edges():
        if src == "sparkpriv" or dst == "sparkpriv":  # the package's own re-exports
            continue
        ls = layer(src)
        if dst == "pyspark":
            if ls == 0:
                wrong.add((src, "pyspark"))
            continue
        ld = layer(dst)
        if ls is None or ld is None:
            continue
        bad = ld > ls or (src.startswith("sparkpriv.privacy") and dst.startswith("sparkpriv.mechanisms"))
        if bad and (src, dst) in KNOWN:
            seen_known.add((src, dst))
        elif bad:
            wrong.add((src, dst))
    assert not wrong, "imports against the layers:\n" + "\n".join(
        f"  {s} ({NAMES[layer(s)]}) -> {d} ({'pyspark' if d == 'pyspark' else NAMES[layer(d)]})"
        for s, d in sorted(wrong))
    stale = KNOWN - seen_known
    assert not stale, f"remove these fixed entries from KNOWN: {sorted(stale)}"


def test_the_check_sees_lazy_and_relative_imports(tmp_path):
    src = "def f():\n    from ..spark import kmeans\n    import pyspark.sql\n"
    p = tmp_path / "m.py"
    p.write_text(src)
    got = set(imports("sparkpriv.mechanisms.m", False, p))
    assert "sparkpriv.spark.kmeans" in got and "pyspark.sql" in got
