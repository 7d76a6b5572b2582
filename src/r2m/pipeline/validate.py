"""What the pipeline checks beyond the params schema, before any stage runs.

:func:`check_files`: the files a dataset's params reference exist (weights, class lists, word
lists, an absolute precomputed-detections path), the chosen backends' optional extras are
installed, and the kind's own check passes (``check`` of its :class:`r2m.catalogs.Kind`).
:func:`check_sup_files`: the supervised baselines' feature weights (``sup_features``) of a dataset
in ``baselines.datasets`` exist.
:func:`load` / :func:`validate` are :func:`r2m.params.load` / :func:`r2m.params.validate` plus
these checks for every selected dataset: what ``r2m <stage>`` and the Snakefile call.
Each failure is one line naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from r2m import params as P
from r2m.catalogs import RECIPES
from r2m.utils.registry import load_target

# options naming files the user must provide (resolved against the working directory)
_DETECT_FILE_OPTIONS = ("weights", "checkpoint", "classes", "mapping", "mid_names")
# backends that need an optional extra: (stage, backend) -> (module, extra, how to install)
_BACKEND_EXTRAS = {
    ("detect_concepts", "tf_oid"): ("tensorflow", "tf", "pip install -e '.[tf]' (or make setup-tf)"),
    ("detect_concepts", "owl"): ("transformers", "owl", "pip install -e '.[owl]' (or make setup-owl)"),
}


# where a feature backend's ``options.weights`` file comes from (said when the file is missing)
_WEIGHT_HINTS = {
    "inception_v4": "put timm's inception_v4.tf_in1k model.safetensors there (the TF-slim ImageNet checkpoint "
                    "the authors used: https://huggingface.co/timm/inception_v4.tf_in1k), or set this dataset's "
                    "catalog overrides extract_features: {backend: inception_v3_fid, options: {weights: null}}",
    "vgg16": "put torchvision's vgg16-397923af.pth there (https://download.pytorch.org/models/vgg16-397923af.pth)",
    "vgg19": "put torchvision's vgg19-dcbb9e9a.pth there (https://download.pytorch.org/models/vgg19-dcbb9e9a.pth)",
}


def _missing_weights(view: P.Params, section: str = "extract_features") -> list[str]:
    """The feature backend's weights file of params ``section`` (``extract_features`` or
    ``sup_features``), and those of its ``options.kinds_from`` backends, when named and absent, with
    where to get it."""
    fp = getattr(view, section)
    nets = [(f"{section}.options", fp.backend, fp.options)]
    for kind, spec in (fp.options.get("kinds_from") or {}).items():
        if isinstance(spec, dict):
            nets.append((f"{section}.options.kinds_from.{kind}.options", spec.get("backend"), spec.get("options") or {}))
    out = []
    for key, backend, options in nets:
        w = options.get("weights")
        if not isinstance(w, str) or not w or Path(w).expanduser().exists():
            continue
        hint = _WEIGHT_HINTS.get(backend)
        out.append(f"{key}.weights: file not found: {w}" + (f" ({backend}: {hint})" if hint else ""))
    return out


def check_sup_files(params: P.Params, dataset: str, source: str = "params") -> None:
    """The supervised baselines' feature weights of one dataset (``sup_features.options.weights``)
    exist; raise :class:`r2m.params.ParamsError` (one line, saying where to put the file) otherwise."""
    errors = _missing_weights(P.for_dataset(params, dataset), "sup_features")
    if errors:
        raise P.ParamsError(f"invalid parameters in {source} (dataset {dataset}, supervised baselines): "
                            + "; ".join(errors))


def _check_selected(params: P.Params, source: str) -> None:
    """:func:`check_files` for every dataset of ``datasets``, :func:`check_sup_files` for every
    dataset of ``baselines.datasets``."""
    for name in params.datasets:
        check_files(params, name, source)
    for name in params.baselines.datasets:
        check_sup_files(params, name, source)


def _missing_extras(params: P.Params) -> list[str]:
    """One line per chosen backend whose optional dependency is not installed (found without importing it)."""
    import importlib.util

    out = []
    for (stage, backend), (module, extra, how) in _BACKEND_EXTRAS.items():
        if getattr(params, stage).backend == backend and importlib.util.find_spec(module) is None:
            out.append(f"{stage}.backend: {backend!r} needs the optional extra '{extra}' ({module} is not "
                       f"installed); install it with: {how}")
    return out


def _missing_files(options: dict[str, Any], keys: tuple[str, ...], prefix: str) -> list[str]:
    out = []
    for k in keys:
        v = options.get(k)
        if isinstance(v, str) and v and not Path(v).expanduser().exists():
            out.append(f"{prefix}.{k}: file not found: {v}")
    for k, v in options.items():  # nested backend options (e.g. offline's classifier: {...})
        if isinstance(v, dict):
            out += _missing_files(v, keys, f"{prefix}.{k}")
    return out


def _recipe_check(params: P.Params, dataset: str) -> list[str]:
    entry = params.catalog[dataset]
    check = RECIPES[entry.kind].check  # the kind's module is imported only when it has a check
    if check is None:
        return []
    try:
        load_target(check)(entry)
    except (OSError, ValueError) as err:
        return [f"catalog.{dataset}: {err}"]
    return []


def check_files(params: P.Params, dataset: str, source: str = "params") -> None:
    """Referenced files of one dataset (recipe inputs, weights, class lists, an absolute
    precomputed-detections path) exist; raise :class:`r2m.params.ParamsError` naming the key otherwise."""
    view = P.for_dataset(params, dataset)
    errors = _missing_files(view.detect_concepts.options, _DETECT_FILE_OPTIONS, "detect_concepts.options")
    errors += _missing_weights(view)
    if view.detect_concepts.backend == "tf_oid":  # a local SavedModel (folder or archive); else a download
        errors += _missing_files(view.detect_concepts.options, ("model",), "detect_concepts.options")
    errors += _missing_extras(view)
    vf = view.fidelity.vocab_filter
    if vf and vf != "glove" and not Path(vf).expanduser().exists():
        errors.append(f"fidelity.vocab_filter: file not found: {vf} (a word list, one word per line; see docs/guide/reproduce.md)")
    path = view.detect_concepts.options.get("path")
    if view.detect_concepts.backend == "precomputed" and isinstance(path, str) and Path(path).is_absolute() \
            and not Path(path).exists():
        errors.append(f"detect_concepts.options.path: file not found: {path}")
    errors += _recipe_check(params, dataset)
    if errors:
        where = f"{source} (dataset {dataset})"
        raise P.ParamsError(f"invalid parameters in {where}: " + "; ".join(errors))


def validate(raw: dict[str, Any], source: str = "params") -> P.Params:
    """The schema (:func:`r2m.params.validate`), then the file checks of every selected dataset."""
    params = P.validate(raw, source)
    _check_selected(params, source)
    return params


def load(path: str | Path = "params.yaml") -> P.Params:
    """:func:`r2m.params.load`, then the file checks of every selected dataset."""
    params = P.load(path)
    _check_selected(params, str(path))
    return params
