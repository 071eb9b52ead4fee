"""The code's shape, as docs/dev/layout.md describes it: a strategy lives in its folder and the registry, imports run
one way, no module reaches into another's private names, no function grows past what one screen shows."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from raydist import registry

PACKAGE = Path(__file__).resolve().parents[1] / "raydist"
STRATEGY_HOME = (PACKAGE / "strategies", PACKAGE / "registry.py")
LONGEST_FUNCTION = 80


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def strategy_words() -> set[str]:
    """What names a strategy: its registry name, its config section, its folder."""
    words = set(registry.names())
    for spec in registry.STRATEGIES.values():
        words.add(spec.section)
        for part in (spec.worker, spec.driver, spec.config, spec.cost, spec.summary_fields, spec.metrics):
            module = part.partition(":")[0]
            if module.startswith("raydist.strategies."):
                words.add(module.split(".")[2])
    return words - {""}


def naming(node: ast.AST, words: set[str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip() in words:
        return f"the string {node.value!r}"
    if isinstance(node, ast.Attribute) and node.attr in words:
        return f"the attribute .{node.attr}"
    if isinstance(node, ast.Name) and node.id in words:
        return f"the name {node.id}"
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        targets = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        for target in targets:
            if target.startswith("raydist.strategies."):
                return f"an import of {target}"
    return None


def test_no_module_outside_the_strategies_and_the_registry_names_a_strategy():
    words = strategy_words()
    found = []
    for path in modules().values():
        if any(path == home or home in path.parents for home in STRATEGY_HOME):
            continue
        for node in ast.walk(tree(path)):
            what = naming(node, words)
            if what:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {what}")
    assert not found, "strategy names outside raydist/strategies/ and the registry:\n" + "\n".join(found)


def test_no_function_is_longer_than_a_screen():
    long = []
    for path in modules().values():
        for node in ast.walk(tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines >= LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "\n".join(long)


def test_no_module_imports_a_private_name_of_another():
    private = []
    for path in modules().values():
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("raydist"):
                private += [
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
    assert not private, "\n".join(private)


def module_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The raydist modules `name` imports when it is imported (top-level statements, not lazy imports inside
    functions, which is how a module defers what it needs only at run time)."""
    found = set()
    for node in tree(path).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("raydist"):
            submodules = {f"{node.module}.{a.name}" for a in node.names} & set(known)
            # `from package import module` needs the module; the package is already being imported.
            found.update(submodules if len(submodules) == len(node.names) else {node.module, *submodules})
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("raydist"))
    return {m for m in found if m in known and m != name}


def test_imports_have_no_cycle():
    known = modules()
    graph = {name: module_imports(name, path, known) for name, path in known.items()}
    # A module's package is imported first; a package that imports its own modules is no cycle.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            raise AssertionError("import cycle: " + " -> ".join(cycle))


# The package order, top to bottom: a module may import its own package and anything below it, never above (imports
# inside functions count: deferring an import does not change which way it points). The registry's "module:attr"
# strings are the one plugin edge, read at run time (raydist/registry.py). Each feature's `command.py` is a face of
# the CLI's, so it stands with the faces.
LAYERS: list[tuple[str, ...]] = [
    ("raydist", "raydist.api", "raydist.cli", "raydist.job", "raydist.config_command", "*.command"),  # faces
    ("raydist.compare", "raydist.doctor"),
    ("raydist.sweeps",),
    ("raydist.slurm",),
    ("raydist.strategies",),
    ("raydist.engines",),
    ("raydist.launcher",),
    ("raydist.train",),
    ("raydist.driver",),
    ("raydist.torchkit",),
    ("raydist.warm",),
    ("raydist.observability",),
    ("raydist.cluster",),
    ("raydist.planning",),
    CONTRACTS := (
        "raydist.registry",
        "raydist.summary",
        "raydist.summary_fields",
        "raydist.config",
        "raydist.jobconfig",
        "raydist.typedconfig",
        "raydist.factories",
        "raydist.hook",
        "raydist.errors",
        "raydist.atomic",
        "raydist.process_exit",
        "raydist.private_api",
        "raydist.versions",
    ),
]
FACES = LAYERS[0][:5]
LONGEST_CLASS = 250


def home(module: str) -> tuple[int, str]:
    """(layer, unit) of a module: its package, or itself at the top level; a feature's command.py is a face."""
    if module.endswith(".command"):
        return 0, module
    best = None
    for rank, layer in enumerate(LAYERS):
        for unit in layer:
            if (module == unit or module.startswith(unit + ".")) and (best is None or len(unit) > len(best[1])):
                best = (rank, unit)
    assert best, f"{module} is in no layer of LAYERS: add it there (and to docs/dev/layout.md)"
    return best


def every_import(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """Every raydist module `name` imports, wherever the statement stands, with its line."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(tree(path)):
        targets = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base.startswith("raydist"):
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("raydist")]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.setdefault(target, node.lineno)
    return found


def test_imports_run_down_the_layers_counting_imports_inside_functions():
    known = modules()
    up = []
    for name, path in known.items():
        rank, unit = home(name)
        for target, line in every_import(name, path, known).items():
            to_rank, to_unit = home(target)
            sideways = to_rank == rank and to_unit != unit and rank not in (0, len(LAYERS) - 1)
            if to_rank < rank or sideways:
                up.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name} imports {target}")
    assert not up, "imports against the layers (tests/test_architecture.py LAYERS):\n" + "\n".join(up)


def test_the_layer_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from raydist.launcher import driver\n")
    found = every_import("raydist.torchkit.late", module, {**modules(), "raydist.torchkit.late": module})
    assert found == {"raydist.launcher.driver": 2}
    assert home("raydist.launcher.driver")[0] < home("raydist.torchkit.late")[0]


def test_the_top_level_holds_only_faces_and_contracts():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    declared = sorted(m.removeprefix("raydist.") for m in (*FACES, *CONTRACTS) if m != "raydist")
    assert top == declared, "a top-level module is neither a face nor a contract: put it in a package"
    assert len(top) <= 20


def test_no_class_is_longer_than_250_lines():
    long = []
    for path in modules().values():
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > LONGEST_CLASS:
                long.append(
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: "
                    f"{node.end_lineno - node.lineno + 1} lines"
                )
    assert not long, "\n".join(long)


def test_no_module_defines_a_top_level_name_twice():
    """A second `def` of a name silently replaces the first for every caller, even those above it."""
    twice = []
    for path in modules().values():
        seen: set[str] = set()
        for node in tree(path).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name in seen:
                    twice.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
                seen.add(node.name)
    assert not twice, "\n".join(twice)


def test_no_function_takes_seven_positional_parameters():
    """Seven or more go in a small typed argument object: call sites then name what they pass."""
    many = []
    for path in modules().values():
        for node in ast.walk(tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                positional = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
                if len(positional) >= 7:
                    many.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {len(positional)}")
    assert not many, "\n".join(many)


def test_ray_trains_controller_needs_no_torch_for_raydists_backend_config():
    # The controller unpickles the config; importing torch there was most of its set-up (docs/dev/startup-changes.md).
    import subprocess
    import sys

    code = (
        "import sys, pickle; from raydist.engines.raytrain_backend import QuietTorchConfig;"
        "pickle.loads(pickle.dumps(QuietTorchConfig(backend='gloo'))); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_the_controller_waits_for_a_group_to_leave_its_process_group_as_long_as_the_driver_says():
    """Ray Train's controller reads TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S from its own environment, which on a
    cluster is its node's, not the driver's: the driver's value travels in the backend config instead."""
    import pickle
    import subprocess
    import sys

    from raydist.engines.raytrain_backend import SHUTDOWN_TIMEOUT_VAR, QuietTorchConfig

    os.environ[SHUTDOWN_TIMEOUT_VAR] = "5"  # what raydist.driver.session sets in the driver
    try:
        config = pickle.dumps(QuietTorchConfig(backend="gloo"))
    finally:
        del os.environ[SHUTDOWN_TIMEOUT_VAR]
    # In a process without the variable, as the controller: a group whose worker died (the quiet path).
    code = (
        "import os, pickle, sys; from ray.exceptions import RayActorError\n"
        "class Group:\n    def __len__(self): return 2\n"
        "    def execute_async(self, *a): raise RayActorError()\n"
        "config = pickle.loads(sys.stdin.buffer.read())\n"
        "config.backend_cls().on_shutdown(Group(), config)\n"
        f"print(os.environ.get({SHUTDOWN_TIMEOUT_VAR!r}))"
    )
    env = {k: v for k, v in os.environ.items() if k != SHUTDOWN_TIMEOUT_VAR}
    out = subprocess.run([sys.executable, "-c", code], input=config, capture_output=True, env=env, timeout=60)
    assert out.stdout.decode().strip() == "5", out.stdout + out.stderr


def test_raydists_backend_config_shows_the_dashboard_what_rays_torch_config_shows():
    from ray.train.torch import TorchConfig

    from raydist.engines.raytrain_backend import QuietTorchConfig

    assert QuietTorchConfig(backend="gloo", timeout_s=7).to_dict() == TorchConfig(backend="gloo", timeout_s=7).to_dict()


def test_a_run_starts_neither_ray_trains_placement_group_cleaner_nor_its_dataset_manager():
    """raydist.engines.raytrain_trainer drops both from Ray Train's default callbacks (the cleaner's job is the driver's,
    `release_placement_group`); a Ray that makes the list elsewhere fails here instead of quietly starting both."""
    from raydist.engines.raytrain_trainer import torch_trainer

    trainer = torch_trainer(train_loop_per_worker=lambda: None)
    names = {type(c).__name__ for c in trainer._create_default_callbacks()}
    assert names and not names & {"PlacementGroupCleanerCallback", "DatasetsCallback"}, names
    assert "BackendSetupCallback" in names  # the list is Ray's, less the two


def test_a_builtin_ray_train_jobs_driver_needs_no_torch_to_check_and_build_its_trainer(tmp_path):
    """A second of the driver's start-up, before Ray: its checks size a built-in data set and model without torch
    (raydist.torchkit.model_size), and its trainer is Ray Train's DataParallelTrainer with raydist's torch-free backend
    config, not TorchTrainer, whose module imports torch; nor does the workers' function that `fit()` builds before
    it asks for the controller (its context, which sets each worker's CUDA device, was Ray's, in a module that
    imports torch: 1.8 s of the driver's, after connecting)."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom raydist import job, registry\nfrom raydist.driver.preflight import check_before_ray\n"
        "from raydist.engines.raytrain import build_trainer\n"
        "cfg = job.parse_job_args('sync', ['--set', 'run.storage_path=' + sys.argv[1]], '')\n"
        "check_before_ray('sync', cfg)\nbuild_trainer(cfg, registry.get('sync'))._get_train_func()\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout[-2000:] + out.stderr[-2000:]


def test_the_dashboards_run_list_learns_torchs_version_without_importing_torch():
    """`raydist launch`'s driver and the async PS's show their run in the dashboard's run list, which names torch's
    version; importing torch for it cost each of their starts about a second of CPU (tests/test_launch.py,
    tests/test_dashboard.py run them)."""
    import subprocess
    import sys

    import torch

    code = "import sys\nfrom raydist.driver.train_view import _torch_version\nprint(_torch_version(), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == [torch.__version__, "False"], out.stdout + out.stderr[-2000:]


PRIVATE_HOME = PACKAGE / "private_api.py"
PRIVATE_MODULE = re.compile(r"^(ray|torch)(\.\w+)*\.(_(?!_)\w*|core\.generated|experimental\.internal_kv)(\.|$)")


def _private_uses(path: Path) -> list[str]:
    """file:line of each private Ray or torch name `path` uses: an import of a private module or name, an
    attribute `_x` of a ray/torch chain, or a string that is a private module's dotted name."""
    found = []
    for node in ast.walk(tree(path)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("ray", "torch"):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in ("ray", "torch"):
                names = [f"{root.id}.{node.attr}"]
            elif node.attr == "_actor_id":
                names = ["ray.actor.ActorHandle._actor_id"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value:
            names = [node.value]
        found += [
            f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {n}"
            for n in names
            if PRIVATE_MODULE.match(n) or re.match(r"^(ray|torch)\._", n) or n.endswith("._actor_id")
        ]
    return found


def test_private_ray_and_torch_apis_are_used_in_one_module_only():
    """Ray and torch change their private modules between releases: raydist/private_api.py holds every use, with
    its reason and the versions checked, and the range pyproject declares is the one CI runs."""
    ours = _defined_in_raydist()
    leaks = [
        use
        for path in modules().values()
        if path != PRIVATE_HOME
        for use in _private_uses(path) + _private_hooks(path, ours)
    ]
    assert not leaks, "use raydist.private_api:\n" + "\n".join(leaks)


def test_the_private_use_check_sees_imports_attributes_and_module_names(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def f(ray, h):\n    from ray._raylet import GcsClient\n    import torch._utils\n"
        "    from ray.train.torch.config import _shutdown_torch\n    ray._private.state.state\n"
        "    h._actor_id.hex()\n    return 'ray.train.v2._internal.x'\n"
    )
    global PACKAGE
    old, PACKAGE = PACKAGE, tmp_path
    try:
        uses = [u.split(" ", 1)[1] for u in _private_uses(planted)]
    finally:
        PACKAGE = old
    assert {
        "ray._raylet",
        "torch._utils",
        "ray.train.torch.config._shutdown_torch",
        "ray._private",
        "ray.actor.ActorHandle._actor_id",
        "ray.train.v2._internal.x",
    } <= set(uses), uses


def _bindings(module: ast.Module) -> dict[str, str]:
    """Every name a module's imports bind, at any depth, to what it stands for:
    `from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer` -> {'DataParallelTrainer': 'ray...'}."""
    bound = {}
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
    return bound


def _dotted(node: ast.AST, bound: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in bound:
        return ".".join([bound[node.id], *reversed(parts)])
    return None


def _defined_in_raydist() -> set[str]:
    """Every name raydist defines somewhere (functions, classes, names and attributes it assigns, parameters,
    keywords, import aliases): a private attribute outside this set is another library's."""
    names = set()
    for path in modules().values():
        for node in ast.walk(tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
    return names


def _private_hooks(path: Path, ours: set[str]) -> list[str]:
    """file:line of what `_private_uses` cannot see by name: a class on a Ray or torch base that overrides a private
    method the base has (`_create_default_callbacks`), Ray's private resource names ('node:__internal_head__'), and
    a private attribute of an object raydist does not define (`handle._actor_id`; the standard library's, on a name
    imported from it, such as `os._exit`, are not Ray's or torch's)."""
    import importlib

    module = tree(path)
    bound, found = _bindings(module), []
    stdlib = {name for name, what in bound.items() if what.split(".")[0] not in ("ray", "torch", "raydist")}
    where = path.relative_to(PACKAGE.parent)
    for node in ast.walk(module):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                dotted = _dotted(base, bound)
                if not dotted or not (
                    dotted.split(".")[0] in ("ray", "torch") or dotted.startswith("raydist.private_api.")
                ):  # a class it re-exports
                    continue
                owner, _, name = dotted.rpartition(".")
                try:
                    cls = getattr(importlib.import_module(owner), name)
                except (ImportError, AttributeError):
                    continue
                found += [
                    f"{where}:{item.lineno} {dotted}.{item.name}"
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and item.name.startswith("_")
                    and not item.name.endswith("__")
                    and hasattr(cls, item.name)
                ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("node:__"):
            found.append(f"{where}:{node.lineno} the resource name {node.value!r}")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.endswith("__")
            and node.attr not in ours
            and node.attr != "_actor_id"
        ):  # _actor_id: _private_uses names it
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in stdlib) and _dotted(node, bound) is None:
                found.append(f"{where}:{node.lineno} {ast.unparse(node)} (a private attribute raydist does not define)")
    return found


def test_the_private_hook_check_sees_overrides_resource_names_and_foreign_private_attributes(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import os\nfrom ray.train.v2.api.data_parallel_trainer import DataParallelTrainer\n"
        "class T(DataParallelTrainer):\n    def _create_default_callbacks(self):\n        return []\n"
        "    def _mine(self):\n        return os._exit\n"
        "def f(nodes, handle):\n    return 'node:__internal_head__' in nodes, handle._ray_secret\n"
    )
    global PACKAGE
    old, PACKAGE = PACKAGE, tmp_path
    try:
        uses = [u.split(" ", 1)[1] for u in _private_hooks(planted, {"_mine"})]
    finally:
        PACKAGE = old
    assert sorted(uses) == [
        "handle._ray_secret (a private attribute raydist does not define)",
        "ray.train.v2.api.data_parallel_trainer.DataParallelTrainer._create_default_callbacks",
        "the resource name 'node:__internal_head__'",
    ], uses


def test_the_warm_interpreter_imports_nothing_of_raydists_as_a_package():
    """raydist/warm/server.py forks users' scripts: a raydist of its own in sys.modules would be every forked
    script's (not the one in a job's working dir), and where raydist is not installed the server would not start. It
    takes raydist/private_api.py by path."""
    import subprocess
    import sys

    code = (
        "import runpy, sys; runpy.run_path(sys.argv[1], run_name='warm');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'raydist'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(PACKAGE / "warm" / "server.py")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


def _resolves(dotted: str) -> bool:
    """Whether 'ray._raylet.Config.initialize' exists here: its longest importable module, then attributes."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                found = getattr(found, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_private_name_raydist_uses_exists_in_the_installed_ray_and_torch():
    """What raydist/private_api.py lists, imports in its functions, names and overrides is there in the Ray and
    torch installed. `make test-min` runs this too, at the oldest Ray pyproject allows: the releases its docstring
    says were checked."""
    from raydist import private_api

    wanted = {f"{module}.{attribute}" if attribute else module for module, attribute, _ in private_api.PRIVATE.values()}
    for node in ast.walk(tree(PRIVATE_HOME)):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] in ("ray", "torch")
        ):
            wanted.update(f"{node.module}.{a.name}" for a in node.names)
    wanted.update(
        {
            private_api.CONTROLLER_LOGGER,
            private_api.DYNAMO_MODULE,
            private_api.TORCHFT_MODULE,
            "ray._raylet.Config.initialize",
            "ray._raylet.AuthenticationTokenLoader.instance",  # reread_ray_settings
            "ray.actor.ActorHandle._actor_id",  # actor_id
            "ray.train.v2.api.data_parallel_trainer.DataParallelTrainer._create_default_callbacks",
            "ray.train.v2.torch.torchft_config._TorchftBackend._maybe_create_lighthouse_actor",
            # what raydist.driver.train_view takes from state_schema and state_util
            *(
                f"ray.train.v2._internal.state.schema.{name}"
                for name in (
                    "ActorStatus",
                    "RunAttemptStatus",
                    "RunStatus",
                    "TrainResources",
                    "TrainRunAttempt",
                    "TrainWorker",
                    "BackendConfig",
                    "CheckpointConfig",
                    "FailureConfig",
                    "RunConfig",
                    "RunSettings",
                    "ScalingConfig",
                    "TrainRun",
                )
            ),
            *(
                f"ray.train.v2._internal.state.util.{name}"
                for name in ("current_time_ns", "mark_workers_dead", "construct_data_config")
            ),
            "ray._private.state.state.get_draining_nodes",  # global_state
            "ray.core.generated.autoscaler_pb2.DrainNodeReason",
        }
    )
    missing = sorted(name for name in wanted if not _resolves(name))
    assert not missing, "not in this Ray or torch:\n" + "\n".join(missing)
