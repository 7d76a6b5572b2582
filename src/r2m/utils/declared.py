"""Registrations read from the source, without importing it.

Validating params must never import torch (Snakemake imports :mod:`r2m.params` on every run), yet
the supervised baselines' names, report labels and params sections live in their model files. A
model file declares them on its class::

    class FooParams(BaseModel):          # pydantic / typing names only
        hidden: int = Field(256, ge=1)

    @SUP_MODELS.register("foo", label="Foo et al. 2020", params=FooParams)
    class Foo(SupervisedCaptioner): ...

and :func:`sup_model_specs` finds them with :mod:`ast`, executing only the params class's source
with pydantic/typing names in scope.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# names a baseline's params class may use (its source is executed with only these in scope)
SPEC_NAMESPACE: dict[str, Any] = {"BaseModel": BaseModel, "ConfigDict": ConfigDict, "Field": Field,
                                  "Literal": Literal, "Any": Any, "field_validator": field_validator,
                                  "model_validator": model_validator}
# every params section's config: no unknown key, no bool/str coerced to a number, no .inf/.nan
STRICT = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


class DeclarationError(ValueError):
    """A registration that cannot be read from the source (names the file and line)."""


@dataclass(frozen=True)
class SupModelSpec:
    """A supervised baseline as its model file declares it: name, report label, params section."""

    name: str
    label: str
    params: type[BaseModel]
    file: Path


def _register_call(node: ast.ClassDef, registry: str) -> ast.Call | None:
    for dec in node.decorator_list:
        if (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr == "register"
                and isinstance(dec.func.value, ast.Name) and dec.func.value.id == registry):
            return dec
    return None


def params_class(file: Path, text: str, tree: ast.Module, name: str) -> type[BaseModel]:
    """Execute the source of class ``name`` of ``file`` with only :data:`SPEC_NAMESPACE` in scope;
    the result forbids unknown keys, validates assignments and coerces no number (as every params
    section)."""
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        raise DeclarationError(f"{file}: params class {name!r} (named in the registration) is not defined there")
    scope = dict(SPEC_NAMESPACE)
    try:
        exec(compile(ast.get_source_segment(text, node) or "", str(file), "exec"), scope)  # noqa: S102
    except NameError as err:
        raise DeclarationError(f"{file}: {name} may use only {sorted(SPEC_NAMESPACE)} ({err})") from None
    cls = scope[name]
    return type(name, (cls,), {"model_config": STRICT,
                               "__module__": "r2m.params", "__doc__": cls.__doc__})


def _files(sources: tuple[Path, ...]) -> list[Path]:
    return [f for src in sources for f in (sorted(src.glob("*.py")) if src.is_dir() else [src]) if f.is_file()]


@functools.cache
def sup_model_specs(sources: tuple[Path, ...], registry: str = "SUP_MODELS") -> tuple[SupModelSpec, ...]:
    """Every ``@<registry>.register("name", label="...", params=XParams)`` class in ``sources``
    (files or package folders), sorted by name; nothing is imported."""
    specs: dict[str, SupModelSpec] = {}
    for file in _files(sources):
        text = file.read_text(encoding="utf-8")
        tree = ast.parse(text, str(file))
        for node in tree.body:
            call = _register_call(node, registry) if isinstance(node, ast.ClassDef) else None
            if call is None:
                continue
            kw = {k.arg: k.value for k in call.keywords}
            try:
                name = ast.literal_eval(call.args[0])
                label = ast.literal_eval(kw["label"])
                params_name = kw["params"].id  # type: ignore[attr-defined]
            except (IndexError, KeyError, AttributeError, ValueError) as err:
                raise DeclarationError(f"{file}:{node.lineno}: write @{registry}.register(\"name\", label=\"...\", "
                                       f"params=ParamsClass) with literal values ({err!r})") from None
            if name in specs:
                raise DeclarationError(f"{registry}: {name!r} registered twice ({specs[name].file}, {file})")
            specs[name] = SupModelSpec(name, label, params_class(file, text, tree, params_name), file)
    return tuple(specs[n] for n in sorted(specs))


def _literal_keys(value: ast.expr, constants: dict[str, ast.expr], where: str) -> tuple[str, ...]:
    node = constants.get(value.id, value) if isinstance(value, ast.Name) else value
    try:
        keys = ast.literal_eval(node)
    except ValueError:
        keys = None
    if not isinstance(keys, tuple) or not all(isinstance(k, str) for k in keys):
        raise DeclarationError(f"{where}: keys= must be a literal tuple of strings (or a module constant holding one)")
    return keys


@functools.cache
def declared_keys(sources: tuple[Path, ...], registry: str, constructors: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """Name -> the ``keys=(...)`` of each ``<registry>.register("name", keys=...)`` in ``sources``
    (a literal tuple, or a module-level constant holding one); read from the source, nothing imported.
    A ``register(<variable>, keys=...)`` inside a loop gives its keys to every name made by a
    ``Ctor("name", ...)`` call of ``constructors`` in the same file (e.g. the paper benchmarks)."""
    from r2m.utils.source_cache import cached_scan

    files = _files(sources)

    def scan() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for file in files:
            tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
            constants = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
                         for t in n.targets if isinstance(t, ast.Name)}
            made = [n.args[0].value for n in ast.walk(tree)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in constructors
                    and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)]
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "register" and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == registry and node.args):
                    continue
                kw = {k.arg: k.value for k in node.keywords}
                keys = _literal_keys(kw["keys"], constants, f"{file}:{node.lineno}") if "keys" in kw else ()
                first = node.args[0]
                names = [first.value] if isinstance(first, ast.Constant) else made
                for name in names:
                    out[name] = list(keys)
        return out

    def valid(value: Any) -> bool:
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, list)
                                               and all(isinstance(x, str) for x in v) for k, v in value.items())

    # kept on disk under the files' content: every r2m job validates params (issue 33)
    found = cached_scan("declared_keys", [registry, list(constructors)], files, scan, valid)
    return {name: tuple(keys) for name, keys in found.items()}


def sup_model_modules(package: Path, dotted: str) -> dict[str, str]:
    """Baseline name -> the module (``dotted`` + file stem) whose file in ``package`` registers it."""
    return {spec.name: f"{dotted}.{spec.file.stem}" for spec in sup_model_specs((package,))}
