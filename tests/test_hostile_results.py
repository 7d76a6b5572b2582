"""Hostile and careless inputs, part B: the DAG sees every input, resume and checkpoints
check their data, evaluation is right for any text, results say what they are.

One test per case. The in-process tiny pipeline (``tiny_run``, a module fixture: every R²M stage on
the synthetic ``tiny`` dataset with a few steps each) serves the params-recording check and the
resume check; everything else uses hand-made files.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from pydantic import BaseModel

from conftest import copy_sources
from r2m import params as P
from r2m.stage import registry as S
from r2m.stage.context import StageContext
from r2m.stage.spec import NOT_RECIPE

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


# --------------------------------------------------------------------------- params actually read
class Recorder:
    """A read-only view of a params object that records the dotted path of every value read
    (``train_xe.steps``, ``fidelity.decoding``, ``catalog.kind``: a catalog entry's items one by one, whichever
    entry); a method called on a section (``model_dump``…) counts as reading the whole section (on an entry:
    ``catalog``, the whole entry, overrides and all)."""

    def __init__(self, target: Any, reads: set[str], path: str = "") -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_reads", reads)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        target, path = object.__getattribute__(self, "_target"), object.__getattribute__(self, "_path")
        reads = object.__getattribute__(self, "_reads")
        value = getattr(target, name)
        if callable(value) and not isinstance(value, BaseModel):  # model_dump(), model_copy(), …
            reads.add(path or "*")
            return value
        here = f"{path}.{name}" if path else name
        if isinstance(value, BaseModel):
            return Recorder(value, reads, here)
        if here == "catalog":
            return CatalogRecorder(value, reads)
        if here == "catalog.overrides":
            return OverridesRecorder(value, reads)
        reads.add(here)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("params are read-only in a stage")


class CatalogRecorder(dict):
    """The catalog as a stage reads it: the dataset names freely, each entry through a :class:`Recorder` whose
    reads are ``catalog.<item>`` (the declarations name items, not datasets)."""

    def __init__(self, catalog: dict[str, Any], reads: set[str]) -> None:
        super().__init__({name: Recorder(entry, reads, "catalog") for name, entry in catalog.items()})


class OverridesRecorder(dict):
    """An entry's ``overrides`` as a stage reads them: one section (``catalog.overrides.<section>``: the stage
    resolves that section as the dataset sees it by hand), or all of them (``catalog.overrides``)."""

    def __init__(self, overrides: dict[str, Any], reads: set[str]) -> None:
        super().__init__(overrides)
        self._reads = reads

    def __getitem__(self, section: str) -> Any:
        self._reads.add(f"catalog.overrides.{section}")
        return super().__getitem__(section)

    def get(self, section: str, default: Any = None) -> Any:
        self._reads.add(f"catalog.overrides.{section}")
        return super().get(section, default)

    def __iter__(self):
        self._reads.add("catalog.overrides")
        return super().__iter__()

    def items(self):
        self._reads.add("catalog.overrides")
        return super().items()

    def values(self):
        self._reads.add("catalog.overrides")
        return super().values()


def covered(read: str, declared: tuple[str, ...]) -> bool:
    """``read`` is declared: the name itself or a section above it; a catalog entry's item ``catalog.X…`` by
    ``catalog.X``, or by ``catalog`` when X is a recipe item (never overrides, fidelity, beta, gamma, seeds);
    the entry's override of one section by that section (what the stage reads is the section as the dataset
    sees it)."""
    head, _, rest = read.partition(".")
    item, _, section = rest.partition(".")
    if head == "catalog" and item == "overrides":
        section = section.partition(".")[0]
        return bool(section) and any(d == section or d.startswith(section + ".") for d in declared)
    if head == "catalog":
        return bool(item) and (f"catalog.{item}" in declared or ("catalog" in declared and item not in NOT_RECIPE))
    return any(read == d or read.startswith(d + ".") for d in declared)


def declared_unread(declared: tuple[str, ...], reads: set[str]) -> list[str]:
    return [d for d in declared if not any(r == d or r.startswith(d + ".") or d.startswith(r + ".") for r in reads)]


SCHED = {"batch_size": 8, "eval_every": 2, "checkpoint_every": 2}
TINY_RAW = {
    "datasets": ["tiny"],
    "variants": ["r2m"],
    "catalog": {"tiny": {"kind": "tiny", "fidelity": "paper", "seed": 0, "n_train_images": 10, "n_val_images": 4,
                         "n_test_images": 10, "n_sentences": 120, "image_size": 32, "beta": 1.0, "gamma": 1.0,
                         "overrides": {"detect_concepts": {"backend": "precomputed"},
                                       "extract_features": {"backend": "random_cnn"},
                                       "sup_features": {"backend": "random_cnn",
                                                        "options": {"kinds": ["pooled", "grid"]}},
                                       "build_vocab": {"min_count": 1}}}},
    "model": {"d": 16, "heads": 2, "d_k": 8},
    "train_xe": {**SCHED, "steps": 4, "lr": 0.003},
    "train_s": {**SCHED, "steps": 2, "lr": 0.001},
    "train_m": {**SCHED, "steps": 2, "lr": 0.0001},
    "train_i": {**SCHED, "steps": 2, "lr": 0.0001},
    "train_e2e": {**SCHED, "steps": 2, "lr": 0.0001},
    "caption": {"beam": 2, "max_len": 8, "batch_size": 4},
    "evaluate": {"scorers": ["bleu"]},
    "baselines": {"datasets": ["tiny"], "models": ["mrnn", "sat", "sat_hard", "scnn"]},
    "sup_vocab": {"min_count": 1},
    "train_sup": {**SCHED, "steps": 2, "lr": 0.003,
                  "per_model": {"sat": {"select_by": "bleu4"}, "scnn": {"pretrain_steps": 2}}},
    "mrnn": {"embed1": 8, "embed2": 16, "recurrent": 16, "multimodal": 16},
    "sat": {"embed": 8, "hidden": 16, "att_dim": 8},
    "sat_hard": {"embed": 8, "hidden": 16, "att_dim": 8},
    "scnn": {"num_concepts": 20, "hidden": 16},
    "report": {"figure_images": 1},
}
TINY_RAW["catalog"]["tiny"]["overrides"]["extract_features"]["options"] = {"kinds": ["pooled", "grid"]}
R2M_STAGES = ("inputs", "prepare", "references", "detect_concepts", "extract_features", "corpus_concepts", "build_vocab",
              "train_xe", "train_s", "train_m", "train_i", "caption", "evaluate")
# the rest of the DAG: (stage, axes) in order
LATER_STAGES = (
    *((st, {"ckpt": c}) for c in ("train_xe", "train_s", "train_m") for st in ("caption", "evaluate")),
    ("table1", {}), ("table2", {}), ("table3", {}), ("figures", {}), ("extract_features_sup", {}), ("sup_vocab", {}),
    ("mostfreq", {}), ("train_e2e", {}),
    *((st, {"model": m}) for m in ("mrnn", "sat", "sat_hard", "scnn")
      for st in ("pretrain_sup", "train_sup", "caption_sup", "evaluate_sup", "inspect_sup", "retrieval_sup")),
    ("retrieval_r2m", {}), ("baselines", {}), ("retrieval", {}), ("claims", {}), ("report", {}),
)


def _run_stage(root: Path, params: P.Params, name: str, reads: set[str] | None = None, **axes: str) -> None:
    from r2m.cli import _load

    stage = S.get(name)
    axes = {a: v for a, v in {"dataset": "tiny", "variant": "r2m", "ckpt": "train_i", **axes}.items()
            if a in stage.axes}
    ctx = StageContext(stage=stage, params=params, root=root, log=logging.getLogger("r2m.test"), **axes)
    if reads is not None:
        object.__setattr__(ctx, "params", Recorder(ctx.params, reads))
    module, func = _load(stage.impl)
    getattr(module, func)(ctx)


INFERENCE = "inference.json"


def recorded_run(root: Path, raw: dict[str, Any], later: tuple = LATER_STAGES) -> tuple[P.Params, dict[str, set[str]]]:
    """The R²M stages and then ``later`` on ``tiny`` in-process under ``root`` (CPU, one thread), with the params
    each read.

    The training stages' ``inference.json`` (:func:`r2m.captioning.settings.build`: the concept,
    detector, feature and caption settings ``r2m caption IMAGES --model`` starts from) records whole
    sections by design; those reads go to their own bucket (:data:`INFERENCE`), checked apart."""
    from r2m.captioning import settings

    torch.set_num_threads(1)
    shutil.copytree(ROOT / "data" / "dictionaries", root / "data" / "dictionaries")
    params = P.for_dataset(P.validate(raw), "tiny")
    reads: dict[str, set[str]] = {}
    build = settings.build

    def unwrapped_build(p, *args, **kw):
        if isinstance(p, Recorder):
            object.__getattribute__(p, "_reads").add(INFERENCE)
            p = object.__getattribute__(p, "_target")
        return build(p, *args, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(settings, "build", unwrapped_build)
    try:
        for name in R2M_STAGES:
            reads[name] = set()
            _run_stage(root, params, name, reads[name])
        for name, axes in later:
            key = "/".join((name, *axes.values()))
            _run_stage(root, params, name, reads.setdefault(key, set()), **axes)
    finally:
        mp.undo()
    return params, reads


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, P.Params, dict[str, set[str]]]:
    """Every stage of the DAG on a tiny ``tiny`` (R²M variant ``r2m``, the four baselines; the paper profile)."""
    root = tmp_path_factory.mktemp("tiny_run")
    return root, *recorded_run(root, TINY_RAW)


@pytest.fixture(scope="module")
def official_run(tmp_path_factory) -> dict[str, set[str]]:
    """R²M's stages on the same ``tiny`` under the official profile (``catalog.tiny.fidelity: official``: the
    authors' code paths — tokenizer, plurals, concept order, decoding, losses, frozen image projection)."""
    raw = json.loads(json.dumps(TINY_RAW))
    raw["catalog"]["tiny"]["fidelity"] = "official"
    return recorded_run(tmp_path_factory.mktemp("official_run"), raw, ())[1]


def test_each_stage_declares_exactly_the_params_it_reads(tiny_run, official_run):
    """Every stage instance reads only params its stage declares, and every declared item is read by
    some instance of the stage (under either profile). Before: corpus_concepts read ``fidelity.vocab_counts``
    without declaring it (a stale corpus after switching it), figures read ``concepts`` and ``variants``
    undeclared, and several stages declared sections they never read (``prepare``; ``catalog`` in
    train_xe, train_m and the supervised stages)."""
    _, _, reads = tiny_run
    problems = []
    unread_by_stage: dict[str, list[set[str]]] = {}
    runs = [*(("paper", k, v) for k, v in reads.items()), *(("official", k, v) for k, v in official_run.items())]
    for profile, key, got in runs:
        name, *values = key.split("/")
        stage = S.get(name)
        axes = {"dataset": "tiny", "variant": "r2m", "ckpt": "train_i", "model": values[0] if values else ""}
        if name in ("caption", "evaluate") and values:
            axes["ckpt"] = values[0]
        declared = tuple(d.format(**axes) for d in stage.params)
        # inference.json holds only what a training stage read itself (captioning.settings.trained), never a
        # copy of every section: its reads are checked like the others
        assert INFERENCE not in got, f"{key}: built inference.json from whole params sections"
        got = got - {INFERENCE}
        assert "*" not in got, f"{profile} {key}: reads the whole params object"
        undeclared = sorted(r for r in got if not covered(r, declared))
        if undeclared:
            problems.append(f"{profile} {key} reads undeclared {undeclared}")
        unread = declared_unread(declared, got)
        unread_by_stage.setdefault(name, []).append({stage.params[declared.index(d)] for d in unread})
    for name, sets in unread_by_stage.items():
        never = set.intersection(*sets)
        if never:
            problems.append(f"{name} declares {sorted(never)} but no instance reads them")
    assert not problems, "\n".join(problems)
    assert {k.split("/")[0] for k in reads} == {s.name for s in S.STAGES}  # every stage was run
    assert set(official_run) == set(R2M_STAGES)
    assert any(r.startswith("catalog.") for r in reads["prepare"])  # entries' items are recorded one by one


def test_the_recorder_sees_a_catalog_entry_item_by_item():
    """What the check above rests on: an entry's items are recorded one by one (recipe items covered by
    ``catalog``, ``beta`` only by ``catalog.beta``), its overrides section by section, a whole entry as such."""
    reads: set[str] = set()
    rec = Recorder(P.validate(TINY_RAW), reads)
    entry = rec.catalog["tiny"]
    assert entry.n_train_images == 10 and entry.beta == 1.0
    assert entry.overrides.get("build_vocab") == {"min_count": 1}
    assert reads == {"catalog.n_train_images", "catalog.beta", "catalog.overrides.build_vocab"}
    assert covered("catalog.n_train_images", ("catalog",)) and not covered("catalog.beta", ("catalog",))
    assert covered("catalog.overrides.build_vocab", ("build_vocab",)) and not covered("catalog.overrides.build_vocab",
                                                                                       ("catalog",))
    entry.model_dump()
    assert "catalog" in reads and not covered("catalog", ("catalog", "catalog.beta"))


# --------------------------------------------------------------------------- the DAG sees every input
def test_prepare_depends_on_the_files_a_dataset_entry_names(tmp_path):
    """Before: a folder entry's images/references/corpus were no dependency of prepare at all."""
    from PIL import Image

    from r2m.pipeline import dag

    (tmp_path / "imgs").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "imgs" / "a.png")
    (tmp_path / "corpus.txt").write_text("a dog runs\n")
    (tmp_path / "refs.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png"}],
                                                    "annotations": [{"image_id": 1, "caption": "a dog"}]}))
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["catalog"]["mine"] = {"kind": "folder", "images": str(tmp_path / "imgs"),
                              "corpus": str(tmp_path / "corpus.txt"), "references": str(tmp_path / "refs.json")}
    params = P.validate(raw)
    from r2m.datasets.inputs import input_files

    assert sorted(input_files(params, "mine")) == sorted(str(tmp_path / f) for f in ("imgs/a.png", "corpus.txt",
                                                                                      "refs.json"))
    assert sorted(Path(f).name for f in input_files(params, "demo")) == ["corpus.txt", "photos.yaml",
                                                                          "references.json"]
    prepare = S.get("prepare")
    assert prepare.deps.get("inputs") == "data/{dataset}/inputs.json"
    doc = yaml.safe_load(dag.render(params))["stages"]
    assert doc["inputs"]["do"]["always_changed"] is True
    assert "data/${item.dataset}/inputs.json" in doc["prepare"]["do"]["deps"]

    # the inputs stage's digest follows the bytes: same bytes, same file; one byte more, another
    view = P.for_dataset(params, "mine")

    def digest() -> dict:
        _run_stage(tmp_path, view, "inputs", dataset="mine")
        return json.loads((tmp_path / "data/mine/inputs.json").read_text())

    first = digest()
    assert [Path(f["path"]).name for f in first["files"]] == ["a.png", "corpus.txt", "refs.json"]
    assert digest() == first
    # a caption's words are the references stage's input, not prepare's (before, prepare read them too); the image
    # list is both's
    from r2m.datasets.inputs import reference_digest

    before = reference_digest(params, "mine")
    (tmp_path / "refs.json").write_text((tmp_path / "refs.json").read_text().replace("a dog", "a cat"))
    assert digest() == first and reference_digest(params, "mine") != before
    (tmp_path / "refs.json").write_text((tmp_path / "refs.json").read_text().replace('"id": 1', '"id": 2'))
    assert digest() != first


def _snake(wd: Path, *args: str) -> str:
    r = subprocess.run([str(BIN / "snakemake"), "--cores", "1", *args], cwd=wd, capture_output=True, text=True,
                       timeout=300, env={**__import__("os").environ, "PATH": f"{BIN}:{__import__('os').environ['PATH']}"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


def test_snakemake_reruns_the_references_not_prepare_after_a_demo_caption_changed(tmp_path):
    """Before: editing data/demo/references.json left prepare "Nothing to be done"; then, once the file was an
    input of `inputs`, it re-ran `inputs`, `prepare` and everything after. The `references` rule's param is the
    digest of the reference file (compared by content): a caption edit re-runs it alone here; `inputs`' digest
    leaves the file out, a comment in photos.yaml re-runs nothing, nor does a photo's description (prepare reads the
    file through a view of the fields it uses); a photo's resource re-runs inputs, prepare and references. DVC,
    after `inputs` ran as `dvc repro` runs it first: prepare is current after a description edit, not after a
    resource edit."""
    copy_sources(ROOT, tmp_path, ("Snakefile", "workflow", "params.yaml", "src", "data/demo", "data/dictionaries"))
    target = "data/demo/references/references.json"
    _snake(tmp_path, target)  # the real stages: inputs, prepare, references (no torch)
    assert "Nothing to be done" in _snake(tmp_path, "-n", target)
    photos = tmp_path / "data/demo/photos.yaml"
    photos.write_text("# a comment\n" + photos.read_text())
    assert "Nothing to be done" in _snake(tmp_path, "-n", target)
    # a photo's description: prepare reads each photo's id, package, resource and sha256 only (inputs digests those)
    photos.write_text(photos.read_text().replace("description: Eileen Collins", "description: Astronaut Collins", 1))
    assert "Nothing to be done" in _snake(tmp_path, "-n", target)
    refs = tmp_path / "data/demo/references.json"
    refs.write_text(refs.read_text().replace(' woman ', ' lady ', 1))  # one word of one caption
    plan = _snake(tmp_path, "-n", target)
    jobs = set(re.findall(r"Job \d+: (\w+):", plan))
    assert "Nothing to be done" not in plan and jobs == {"references"}, plan[-3000:]
    _snake(tmp_path, target)
    got = json.loads((tmp_path / target).read_text())
    assert sum(" lady " in a["caption"] for a in got["annotations"]) == 1
    # a photo's resource (another file of its package): inputs, prepare and what reads the prepared folder
    photos.write_text(photos.read_text().replace("resource: data/astronaut.png", "resource: data/camera.png", 1))
    plan = _snake(tmp_path, "-n", target)
    assert set(re.findall(r"Job \d+: (\w+):", plan)) == {"inputs", "prepare", "references"}, plan[-3000:]
    # DVC: `dvc repro` runs inputs (always changed), then compares prepare's deps (inputs.json) and stamp
    photos.write_text(photos.read_text().replace("resource: data/camera.png", "resource: data/astronaut.png", 1))
    from r2m.pipeline.dag import render

    (tmp_path / "dvc.yaml").write_text(render(P.load(tmp_path / "params.yaml")))
    _tool(tmp_path, "dvc", "init", "--no-scm", "-q")
    (tmp_path / ".dvcignore").write_text((ROOT / ".dvcignore").read_text())
    _tool(tmp_path, "r2m", "stamps")
    _tool(tmp_path, "dvc", "commit", "-f", "-q", "inputs@demo", "prepare@demo")

    def dvc_prepare() -> dict:
        _tool(tmp_path, "r2m", "inputs", "--dataset", "demo", "--no-log-file")
        _tool(tmp_path, "r2m", "stamps")
        return json.loads(_tool(tmp_path, "dvc", "status", "--json", "prepare@demo").strip().splitlines()[-1])

    assert dvc_prepare() == {}
    photos.write_text(photos.read_text().replace("description: Astronaut Collins", "description: Commander Collins", 1))
    assert dvc_prepare() == {}
    photos.write_text(photos.read_text().replace("resource: data/astronaut.png", "resource: data/camera.png", 1))
    assert list(dvc_prepare()) == ["prepare@demo"]


def _tool(wd: Path, name: str, *args: str) -> str:
    r = subprocess.run([str(BIN / name), *args], cwd=wd, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "DVC_NO_ANALYTICS": "1",
                            "PATH": f"{BIN}:{__import__('os').environ['PATH']}"})
    assert r.returncode == 0, f"{name} {args}: " + r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_resume_fingerprint_follows_the_input_data(tiny_run, tmp_path):
    """Before: the fingerprint held the params (and init) only: after the corpus changed,
    train_xe resumed at its last step on the new data."""
    from r2m.training import loop as L

    root, params, _ = tiny_run
    work = tmp_path / "copy"
    for d in ("data/tiny/corpus", "data/tiny/vocab"):
        shutil.copytree(root / d, work / d)
    ctx = StageContext(stage=S.get("train_xe"), params=params, dataset="tiny", variant="r2m", root=work)
    before = L.fingerprint(ctx)
    assert L.fingerprint(ctx) == before  # same data, same params: resumable
    corpus = next((work / "data/tiny/corpus").glob("*.parquet"))
    import pyarrow.parquet as pq

    table = pq.read_table(corpus)
    pq.write_table(table.slice(0, table.num_rows - 1), corpus)  # one sentence fewer
    assert L.fingerprint(ctx) != before


# --------------------------------------------------------------------------- checkpoints carry a digest
def _flip_tensor_byte(path: Path) -> None:
    ckpt = torch.load(path, weights_only=True)
    key, tensor = next((k, v) for k, v in ckpt["state_dict"].items() if v.numel() >= 64 and v.is_floating_point())
    data = bytearray(path.read_bytes())
    at = data.find(tensor.contiguous().view(-1).numpy().tobytes()[:32])
    assert at > 0, f"tensor {key} not found in {path}"
    data[at + 8] ^= 0x5A
    path.write_bytes(bytes(data))


def test_corrupted_checkpoint_is_one_line_naming_the_file_and_captions_nothing(tiny_run, tmp_path):
    """Before: a model.pt with flipped weight bytes loaded and captioned garbage (exit 0)."""
    from r2m.models.catalog import load_model
    from r2m.utils.checkpoint import CheckpointError

    root, params, _ = tiny_run
    work = tmp_path / "w"
    for d in ("data/tiny/prepared", "data/tiny/vocab", "data/tiny/concepts", "data/tiny/features",
              "models/tiny/r2m/s0/train_i", "data/dictionaries"):
        shutil.copytree(root / d, work / d)
    model_pt = work / "models/tiny/r2m/s0/train_i/model.pt"
    assert "digest" in torch.load(model_pt, weights_only=True)
    load_model(model_pt.parent)  # intact: loads
    _flip_tensor_byte(model_pt)
    with pytest.raises(CheckpointError) as err:
        load_model(model_pt.parent)
    assert str(model_pt) in str(err.value) and "\n" not in str(err.value) and "corrupt" in str(err.value)
    with pytest.raises(CheckpointError):
        _run_stage(work, params, "caption", ckpt="train_i")
    assert not (work / "results/tiny/r2m/s0/train_i/captions.json").exists()


# --------------------------------------------------------------------------- evaluation correct for any text
BREAKS = ["\r", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\u2028", "\u2029", "\t",
          "\x00", "\x07", "\x7f", "\u200b", "\u00a0", "\u3000", "\ufeff", "\U0010ffff", "\ue000"]
WORDS = ["a", "dog", "é", "中", "😀", "<p>", "&amp;", "''", "``", "\\", "-", "...", " ", "  "]


def _random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 10)):
        r = rng.random()
        parts.append(rng.choice(BREAKS) if r < 0.35 else rng.choice(WORDS) if r < 0.8
                     else chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff), rng.randint(0x10000, 0x1ffff)])))
    return "".join(parts)


def test_each_image_scores_do_not_depend_on_other_images_text():
    """Property (seeded random Unicode: controls, every line break and separator, empty strings):
    two fixed images keep their tokens and per-image BLEU/ROUGE-L whatever the other images say.
    Before: a \\u2028, \\x85 or \\x0b in one caption split its tokenizer line and shifted every later
    image's references (or a lone surrogate crashed the tokenizer)."""
    from r2m.evaluation import coco

    fixed_refs = {"A": ["a dog runs on the grass", "a brown dog"], "Z": ["two cats sit on a mat", "cats on a mat"]}
    fixed_res = {"A": "a dog on the grass", "Z": "a cat on a mat"}
    base_m, base = coco.evaluate(fixed_res, fixed_refs, ["bleu", "rouge"], parallel="serial")
    rng = random.Random(20)
    for trial in range(4):
        n = rng.randint(1, 12)
        others = {f"x{trial}_{i}": [_random_text(rng) for _ in range(rng.randint(1, 3))] for i in range(n)}
        for caps in others.values():  # every image keeps one reference with a word (scored, not refused)
            caps.append(f"w{rng.randint(0, 9)} " + caps[0])
        refs = {"A": fixed_refs["A"], **others, "Z": fixed_refs["Z"]}
        res = {"A": fixed_res["A"], **{k: _random_text(rng) for k in others}, "Z": fixed_res["Z"]}
        if trial == 0:  # a lone surrogate (a careless decoder's output) too
            res[next(iter(others))] = "a " + chr(0xD800) + " dog"
        g, r = coco.tokenize({k: list(v) for k, v in refs.items()}, {k: [v] for k, v in res.items()})
        assert g["A"] == ["a dog runs on the grass", "a brown dog"] and r["Z"] == ["a cat on a mat"], trial
        for k, caps in g.items():
            assert all("\n" not in c and "\r" not in c for c in caps), (trial, k)
        g, r = coco.tokenize({k: list(v) for k, v in refs.items()}, {k: [v] for k, v in res.items()}, "none")
        assert all(c == " ".join(c.split()) for caps in [*g.values(), *r.values()] for c in caps), trial  # one line
        _, per = coco.evaluate(res, refs, ["bleu", "rouge"], parallel="serial")
        for k in ("A", "Z"):
            assert per[k] == pytest.approx(base[k]), (trial, k)


def _refs_doc(images: list[tuple[str, str]], caps: list[tuple[str, str]]) -> dict:
    return {"images": [{"id": i, "file_name": f, "split": "test"} for i, f in images],
            "annotations": [{"id": n, "image_id": i, "caption": c} for n, (i, c) in enumerate(caps)]}


def test_empty_references_and_duplicate_file_names_are_reported(tmp_path, caplog):
    """Before: an empty reference was scored (as 0) without a word, and two ids naming one file
    passed unremarked."""
    from r2m.evaluation.stage import evaluate_files

    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps(_refs_doc([("1", "a.jpg"), ("2", "b.jpg"), ("3", "b.jpg")],
                                         [("1", "a dog runs"), ("1", ""), ("1", " \u2028 "), ("2", "a cat"),
                                          ("3", "a cat sits")])))
    res = tmp_path / "res.json"
    res.write_text(json.dumps([{"image_id": "1", "caption": "a dog runs"}, {"image_id": "2", "caption": "a cat"},
                               {"image_id": "3", "caption": "a cat"}]))
    with caplog.at_level(logging.WARNING, logger="r2m"):
        out = evaluate_files(res, refs, ["bleu"], parallel="serial")
    assert out["reference_problems"] == {"empty_references": 2, "duplicate_file_names": 1}
    text = caplog.text
    assert "2 empty reference caption(s) not scored" in text and "'b.jpg' is named by 2 image ids" in text
    assert out["images"]["1"]["Bleu_1"] == pytest.approx(1.0)  # image 1: against "a dog runs" only
    assert out["split"] == "test"


def test_folder_recipe_reports_two_reference_ids_naming_one_file(tmp_path, caplog):
    """Before: the folder recipe kept one of two ids naming one file and dropped the other silently."""
    from PIL import Image

    from r2m.datasets.folder import folder

    (tmp_path / "imgs").mkdir()
    for name in ("a.png", "b.png"):
        Image.new("RGB", (8, 8)).save(tmp_path / "imgs" / name)
    (tmp_path / "corpus.txt").write_text("a dog runs\na cat sits\n")
    (tmp_path / "refs.json").write_text(json.dumps(_refs_doc([("1", "a.png"), ("2", "b.png"), ("9", "b.png")],
                                                             [("1", "a dog"), ("2", "a cat"), ("9", "a kitten")])))
    entry = P.DatasetEntry.model_validate({"kind": "folder", "images": str(tmp_path / "imgs"),
                                           "corpus": str(tmp_path / "corpus.txt"),
                                           "references": str(tmp_path / "refs.json")})
    out = tmp_path / "prepared"
    out.mkdir()
    with caplog.at_level(logging.WARNING):
        manifest = folder(entry, out, logging.getLogger("r2m.test"))
    assert manifest["duplicate_reference_ids"] == [["b.png", "2", "9"]]
    assert "named by 2 image ids ('2', '9'); keeping '2'" in caplog.text
    from r2m.evaluation.stage import recipe_duplicates

    assert recipe_duplicates(out / "manifest.json") == [["b.png", "2", "9"]]
    # the references stage keeps the kept id's captions, and takes the dropped id for no stale index
    from r2m.datasets.recipes import build_references

    build_references(entry, out, tmp_path / "references", logging.getLogger("r2m.test"))
    got = json.loads((tmp_path / "references/references.json").read_text())
    assert [(a["image_id"], a["caption"]) for a in got["annotations"]] == [("1", "a dog"), ("2", "a cat")]


# --------------------------------------------------------------------------- results say what they are
def _eval(**extra: Any) -> dict:
    return {"Bleu_1": 0.5, "Bleu_2": 0.4, "Bleu_3": 0.3, "Bleu_4": 0.2, "METEOR": 0.1, "ROUGE_L": 0.3,
            "CIDEr": 0.4, "SPICE": None, "concept_recall": 0.5, "concept_any": 0.9, "n_images": 16,
            "missing_images": 0, "unreadable_images": 0, "unreadable_image_ids": [], "split": "test", **extra}


def test_tables_name_the_split_and_images_and_mark_partial_and_val_rows(tmp_path):
    """Before: partial (--allow-partial) and caption.split: val results printed like test-set rows."""
    from r2m.reports import html, tables

    spec = tables.TABLES["table2"]
    evals = {("tiny", "r2m"): _eval(), ("tiny", "no_fm"): _eval(n_images=10, missing_images=6),
             ("tiny", "d_lstm"): _eval(split="val", n_images=8)}
    rows = tables.build_rows(spec, ["tiny"], ["r2m", "no_fm", "d_lstm"], evals)
    by_method = {r[1]: dict(zip(tables.HEADER, r, strict=True)) for r in rows if r[2] == tables.THIS_RUN}
    full, partial, val = (by_method[spec.labels[k]] for k in ("r2m", "no_fm", "d_lstm"))
    assert (full["split"], full["images"], full["note"]) == ("test", "16", "")
    assert partial["images"] == "10" and "PARTIAL: 10 of 16 images" in partial["note"]
    assert val["split"] == "val" and "not the test set" in val["note"]
    md = tables.to_markdown(spec, rows, tables.eval_notes(evals))
    assert "| Split | Images | Note |" in md and "PARTIAL" in md and "split val, not the test set" in md
    (tmp_path / "t.csv").write_text(tables.to_csv(rows))
    page = html.table_html(html.read_table_csv(tmp_path / "t.csv"))
    assert "<th>split</th><th>images</th><th>note</th>" in page and "PARTIAL: 10 of 16 images" in page


def test_baselines_table_names_the_split_and_images(tmp_path):
    from r2m.reports import baselines

    evals = {("tiny", "mrnn"): _eval(n_images=10, missing_images=6)}
    mostfreq = {"tiny": _eval(caption="a dog", split="val")}
    rows = baselines.baseline_rows(["tiny"], ["mrnn"], evals, {}, mostfreq)
    mrnn = dict(zip(baselines.BASE_HEADER, rows[0], strict=True))
    ref = dict(zip(baselines.BASE_HEADER, rows[1], strict=True))
    assert mrnn["split"] == "test" and mrnn["images"] == "10" and "PARTIAL" in mrnn["note"]
    assert ref["split"] == "val" and "not the test set" in ref["note"]


def test_no_scorers_is_refused_up_front(tmp_path):
    """Before: ``evaluate.scorers: []`` validated and gave a Table 1 row of blanks."""
    from r2m.evaluation import coco
    from r2m.reports import tables

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["evaluate"] = {"scorers": []}
    with pytest.raises(P.ParamsError, match="evaluate.scorers"):
        P.validate(raw)
    with pytest.raises(ValueError, match="no scorers"):
        coco.evaluate({"1": "a dog"}, {"1": ["a dog"]}, [])
    r = subprocess.run([str(BIN / "r2m"), "evaluate", "--results", "x.json", "--references", "y.json",
                        "--scorers", ","], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "no scorer named" in r.stderr
    # an eval.json without any caption metric (written elsewhere) is a row that says so, not blanks
    blank = {k: None for k in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")}
    assert "no scorers" in tables.scope_cells({**blank, "n_images": 3, "split": "test"})[2]


def test_retrieval_chance_keeps_every_k_with_few_candidates():
    """Probe beyond the issue: a split of fewer than 10 images made retrieval's chance row lack R@5 /
    R@10 (a KeyError traceback in retrieval_sup's summary)."""
    from r2m.supervised.retrieval import KS, chance_metrics

    out = chance_metrics(4, 1)
    assert [f"R@{k}" for k in KS] == [k for k in out if k.startswith("R@")]
    assert out["R@10"] == pytest.approx(100.0) and out["R@1"] == pytest.approx(25.0)
