"""The training layer uses the dataset's narrow interface only, the one users' loops use.

`lint-imports` keeps `shardfeed._training` from importing the data layer's
storage modules; this test closes the other door: attribute reads on a
dataset object. It parses every module of `shardfeed/_training` and the TF
training modules in `shardfeed/_tf`, and fails on any attribute of a
`ShardedResidentDataset` outside `INTERFACE`, and checks that each name in
`INTERFACE` is a documented property or method of the class (not a bare
instance attribute that would expose its storage).

Inside each backend (`_tf`, `_jax`) no two modules import each other, even
through `TYPE_CHECKING` imports (which `lint-imports` leaves out): a module
below types what it reads of one above by a `Protocol`.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import pathlib

import pytest

import shardfeed
from shardfeed._tf.dataset import ShardedResidentDataset

TRAINING = pathlib.Path(shardfeed.__file__).parent / "_training"
TF = pathlib.Path(shardfeed.__file__).parent / "_tf"
# TF training modules (as in pyproject's "Training sees data only through ...").
TF_TRAINING = (
    "calls compiled epochs evaluation inputs loop model_steps "
    "predictions saving step_optimizers sync traces training"
).split()

# What the training layer may read: documented in docs/custom_loops.md (users'
# loops) or on the class itself.
INTERFACE = {
    "augment",
    "element_spec",
    "epoch",
    "eval_plan",
    "global_batch_size",
    "has_targets",
    "is_streaming",
    "iterator",
    "label_stats",
    "load_options",
    "order_is_global",
    "order_name",
    "order_is_replayable",
    "num_rows",
    "per_replica_batch_size",
    "plan",
    "row_specs",
    "seed",
    "shuffle",
    "split",
    "trace_signature",
    "training_plan",
    "transform",
    "world",
}

# Reads allowed beside the interface, each with its reason. The engine runs the
# dataset's replicas and is built once with its world (one per dataset); the loop
# cache and the sparse-label check take it from there rather than build their own.
EXEMPT: set[tuple[str, str]] = {("compiled.py", "engine"), ("inputs.py", "engine")}

_NAMES = {"dataset", "ds"}  # the training layer's names for a dataset
_ATTRIBUTES = {"dataset", "_dataset"}  # `self.dataset`, `loop.dataset`, `epoch._dataset`


def _mentions_dataset(node: ast.AST | None) -> bool:
    return node is not None and "ShardedResidentDataset" in ast.unparse(node)


def _is_dataset(node: ast.expr, names: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    return isinstance(node, ast.Attribute) and node.attr in _ATTRIBUTES


def _dataset_names(function: ast.AST) -> set[str]:
    """Names that hold a dataset in `function`: the usual names, parameters
    annotated with the class, names checked with `isinstance(name,
    ShardedResidentDataset)`, and names assigned from a dataset."""
    names = set(_NAMES)
    arguments = getattr(function, "args", None)
    if arguments is not None:
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if _mentions_dataset(arg.annotation):
                names.add(arg.arg)
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance"
            and len(node.args) == 2
            and isinstance(node.args[0], ast.Name)
            and _mentions_dataset(node.args[1])
        ):
            names.add(node.args[0].id)
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and _is_dataset(node.value, names):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def reads_outside_interface(path: pathlib.Path) -> list[str]:
    """`file:line dataset.attribute` for each read of a dataset attribute
    outside `INTERFACE` (and `EXEMPT`) in the module at `path`."""
    tree = ast.parse(path.read_text())
    found = set()
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.Lambda))]
    for scope in scopes:
        names = _dataset_names(scope)
        for node in ast.walk(scope):
            if (
                isinstance(node, ast.Attribute)
                and _is_dataset(node.value, names)
                and node.attr not in INTERFACE
                and (path.name, node.attr) not in EXEMPT
            ):
                found.add(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return sorted(found)


def test_training_reads_only_the_dataset_interface():
    paths = [*sorted(TRAINING.glob("*.py")), *(TF / f"{n}.py" for n in TF_TRAINING)]
    found = [hit for path in paths for hit in reads_outside_interface(path)]
    assert found == []


def test_the_interface_is_documented_properties_and_methods():
    for name in sorted(INTERFACE):
        member = inspect.getattr_static(ShardedResidentDataset, name, None)
        assert isinstance(member, property | staticmethod | classmethod) or inspect.isfunction(
            member
        ), f"ShardedResidentDataset.{name} is not a property or method"
        doc = member.fget.__doc__ if isinstance(member, property) else member.__doc__
        assert doc and doc.strip(), f"ShardedResidentDataset.{name} has no docstring"


def test_the_scan_sees_reads_into_storage(tmp_path):
    # The scan itself can fail: each form the training layer uses is caught.
    module = tmp_path / "probe.py"
    module.write_text(
        "def f(dataset, other: 'ShardedResidentDataset | None', data):\n"
        "    dataset.columns\n"
        "    other.stores\n"
        "    if isinstance(data, ShardedResidentDataset):\n"
        "        data.residency\n"
        "    ds = self.dataset\n"
        "    ds.exchange\n"
        "    dataset.plan\n"
        "    data.dtype\n"  # conservative: `isinstance` marks `data` in the whole function
    )
    assert reads_outside_interface(module) == [
        "probe.py:2 dataset.columns",
        "probe.py:3 other.stores",
        "probe.py:5 data.residency",
        "probe.py:7 ds.exchange",
        "probe.py:9 data.dtype",
    ]


def _circles(graph, package: str) -> list[str]:
    """Each pair of `package`'s modules that import each other (a chain each
    way), as the two chains."""
    modules = sorted(m for m in graph.modules if m.startswith(package + "."))
    found = []
    for a, b in itertools.combinations(modules, 2):
        there = graph.find_shortest_chain(importer=a, imported=b)
        back = graph.find_shortest_chain(importer=b, imported=a)
        if there and back:
            found.append(" -> ".join(there) + " | " + " -> ".join(back))
    return found


@pytest.mark.parametrize("package", ["shardfeed._tf", "shardfeed._jax"])
def test_no_import_circles_inside_a_backend_type_checking_included(package):
    import grimp  # import-linter's graph builder (requirements-ci.txt)

    graph = grimp.build_graph("shardfeed", exclude_type_checking_imports=False, cache_dir=None)
    assert graph.chain_exists(importer=f"{package}.dataset", imported=f"{package}.epoch")
    assert _circles(graph, package) == []
