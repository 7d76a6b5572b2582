"""Typed, validated pipeline parameters (``params.yaml``): the schema and the fidelity profiles.

One section per stage plus ``datasets`` (which datasets the DAG builds), ``variants`` (which R2M
variants are trained) and ``catalog`` (the dataset recipes). A catalog entry may carry
``overrides``: a nested mapping deep-merged over the stage sections for that dataset only, so
``demo`` and ``tiny`` can train for fewer steps without touching the paper defaults.

Each supervised baseline brings its own section: the params class of its entry in
:data:`r2m.baselines.BASELINES` (a light module: validating params never imports a model file or torch).
Dataset kinds, their option keys and the detector and feature backends are the names of :mod:`r2m.catalogs`.

Only the schema lives here: file / extra / recipe checks are :mod:`r2m.pipeline.validate`, the
DAG's axis values :mod:`r2m.stage.axes`. Runtime settings (device, threads, workers) are *not*
params: they come from the command line or the environment (see :mod:`r2m.runtime`).

(Over 450 lines on purpose: it is one pydantic class per params section, the fidelity profile
table and the strict checks every section shares (names, no coercion, no non-finite numbers),
plus ``load``/``validate``; splitting the one schema users read would scatter its contract.)
"""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from r2m.baselines import BASELINES, Section
from r2m.catalogs import DETECTORS, FEATURE_BACKENDS, RECIPES
from r2m.utils.strict_yaml import StrictLoader, yaml_load  # noqa: F401 (used by the Snakefile and tests)

VARIANT_NAMES = ("r2m", "no_fm", "d_lstm", "r_lstm", "dr_lstm")
TRAIN_STAGES = ("train_xe", "train_s", "train_m", "train_i")


# the largest batch any section accepts: more rows than this in one batch is a typo (1e12), not a setting
MAX_BATCH = 1 << 20
# a seed is 0 .. 2**32 - 1: what numpy's legacy seeding and every RNG the project seeds take (torch takes up to
# 2**64 - 1, numpy's SeedSequence any non-negative integer); a run's seed is added to each section's seed, and two
# such seeds add up to far below torch's limit (2**64 failed in training: "Overflow when unpacking long long")
MAX_SEED = 2**32 - 1
# beam width: each step scores batch x beam x vocabulary candidates (beam 100,000 with a 10,000-word vocabulary is
# 4 GB of scores per image); published captioners use 1 to 20, and no width above a few dozen changes a caption
MAX_BEAM = 100


class ParamsError(ValueError):
    """Raised for invalid parameters; the message names the offending key."""


def _known(value: str, names: list[str], what: str) -> str:
    if names and value not in names:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(names)}")
    return value


# supervised seed baselines (image-caption pairs), each with a params section of its own name
SUP_MODEL_NAMES: tuple[str, ...] = tuple(BASELINES.names())
SUP_MODEL_LABELS: dict[str, str] = {name: b.label for name, b in BASELINES.items()}


# catalog (dataset) names become folder names and command-line arguments: one strict pattern
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_name(name: object, what: str = "dataset name") -> str:
    """``name`` when it matches :data:`NAME_PATTERN` and holds no ``..``; else a one-line ValueError."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise ValueError(f"{what} {name!r} is not allowed: use 1 to 64 letters, digits, '_', '.' or '-', "
                         f"starting with a letter or digit, without '..'")
    return name


_Section = Section  # strict: no unknown key, no coercion, no non-finite number


def seed_numbers(value: Any) -> Any:
    """A seed list as given on a command line (Snakemake's ``--config 'seeds=[0,1]'`` reads ``["0", "1"]``):
    digit strings become integers, anything else is left to the schema."""
    def one(x: Any) -> Any:
        return int(x) if isinstance(x, str) and re.fullmatch(r"[+-]?[0-9]+", x.strip()) else x

    if isinstance(value, list):
        return [one(x) for x in value]
    if isinstance(value, dict):
        return {k: seed_numbers(v) for k, v in value.items()}
    return value


def check_seeds(seeds: list[int], what: str) -> list[int]:
    """A seed list: non-empty, each seed an integer in ``0 .. MAX_SEED`` named once (seeds name folders: ``s<seed>``)."""
    if not seeds:
        raise ValueError(f"{what}: give at least one seed")
    bad = [x for x in seeds if not 0 <= x <= MAX_SEED]
    if bad:
        raise ValueError(f"{what}: a seed is a non-negative integer, at most {MAX_SEED} (2**32 - 1, what the random "
                         f"number generators take), got {bad[0]}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{what}: a seed is listed twice in {seeds}")
    return seeds


# --------------------------------------------------------------------------- datasets
class DatasetEntry(_Section):
    """A dataset recipe. ``kind`` selects the recipe in :mod:`r2m.datasets`; the remaining keys
    are recipe options (validated by the recipe itself), except the ones declared here."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
    kind: str
    fidelity: Literal["paper", "official"] | None = Field(
        None, description="profile resolving every item of the 'fidelity' section left null: 'paper' (the "
        "method as written) or 'official' (the authors' released code); null = the recipe's default")
    beta: float = Field(1.0, ge=0, description="weight of L_rec^S in L_S (Eq. 11)")
    gamma: float = Field(1.0, ge=0, description="weight of L_rec^I in L_I (Eq. 13)")
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seeds: list[int] | dict[str, list[int]] | None = Field(
        None, description="the training seeds of this dataset's runs (the DAG's seed axis): a list for every "
        "variant and baseline, or per name ({r2m: [0, 1, 2]}; names not listed: the top-level `seeds`); "
        "null = the top-level `seeds`")

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_numbers(cls, v: Any) -> Any:
        return seed_numbers(v)

    @field_validator("seeds")
    @classmethod
    def _seed_lists(cls, v: Any) -> Any:
        if isinstance(v, dict):
            known = (*VARIANT_NAMES, *SUP_MODEL_NAMES)
            for name, seeds in v.items():
                if name not in known:
                    raise ValueError(f"seeds.{name}: not a variant or baseline ({', '.join(known)})")
                check_seeds(seeds, f"seeds.{name}")
        elif v is not None:
            check_seeds(v, "seeds")
        return v

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        return _known(v, RECIPES.names(), "dataset kind")

    @model_validator(mode="after")
    def _known_keys(self) -> DatasetEntry:
        """A recipe's options are the keys its catalogue entry names (``keys``): a misspelt key is an
        error, never silently ignored."""
        keys = RECIPES[self.kind].keys if self.kind in RECIPES else None
        unknown = sorted(set(self.model_extra or {}) - set(keys or ()))
        if keys is not None and unknown:
            common = sorted(set(type(self).model_fields))
            raise ValueError(f"unknown key(s) {unknown} for kind {self.kind!r}; its keys: "
                             f"{', '.join(sorted(keys)) or '(none)'} (and {', '.join(common)})")
        return self


# --------------------------------------------------------------------------- stage sections
class ConceptsParams(_Section):
    dictionary: Literal["openimages", "coco80"] = "openimages"
    score_threshold: float | None = Field(
        None, ge=0, le=1, description="detections scoring below it are no concept; null = from the fidelity "
        "profile (paper: 0.3, the text's; official: 0, every detection the detector returned, as the released code)")
    max_per_image: int = Field(5, ge=1)


class DetectParams(_Section):
    backend: str = "offline"
    batch_size: int = Field(8, ge=1, le=MAX_BATCH)
    min_side: int = Field(32, ge=1, description="images smaller than this are listed as bad")
    floor: float | None = Field(
        None, ge=0, le=1, description="the lowest score a backend keeps when its options set no `floor`: null = "
        "each backend's own (0.05; faces 0.9); the official profile: 0 (every detection up to the backend's cap)")
    options: dict[str, Any] = Field(default_factory=dict, description="backend-specific options")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        return _known(v, DETECTORS.names(), "detector backend")


class FeatureParams(_Section):
    backend: str = "inception_v3_fid"
    batch_size: int = Field(32, ge=1, le=MAX_BATCH)
    shard_size: int = Field(4096, ge=1)
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        return _known(v, FEATURE_BACKENDS.names(), "feature backend")


class R2MFeatureParams(FeatureParams):
    """``extract_features``: R²M's features; :class:`FeatureParams` plus the cached random crops."""

    crops: int | None = Field(
        None, ge=0, le=64, description="K seeded random crops per image stored beside its usual view (kind "
        "pooled_crops), one drawn per image and step by the image stages: the released code's fresh random 299 "
        "crop of the 346 resize at every step, cached (0: the usual view only). null = profile (paper 0, official 8)")


class CorpusParams(_Section):
    min_tokens: int = Field(1, ge=1, description="drop sentences with fewer tokens")
    max_tokens: int = Field(40, ge=1, description="drop sentences with more tokens")
    require_concept: bool = True
    holdout: float = Field(0.01, ge=0, lt=1, description="fraction held out for validation")
    seed: int = Field(0, ge=0, le=MAX_SEED)

    @model_validator(mode="after")
    def _min_le_max(self) -> CorpusParams:
        if self.min_tokens > self.max_tokens:  # every sentence would be dropped (a warning, then empty stages)
            raise ValueError(f"min_tokens={self.min_tokens} is above max_tokens={self.max_tokens}: no sentence "
                             "could be kept")
        return self


class VocabParams(_Section):
    min_count: int = Field(40, ge=1)
    max_unk_ratio: float = Field(0.15, ge=0, le=1)


class ModelParams(_Section):
    d: int = Field(512, ge=8)
    heads: int = Field(2, ge=1)
    d_k: int = Field(256, ge=1)
    memory_slots: int = Field(1, ge=1)
    dropout: float = Field(0.2, ge=0, lt=1)
    mlp_layers: int = Field(2, ge=1)
    image_proj: Literal["learned", "frozen_random"] | None = Field(
        None, description="null = from the fidelity profile (paper: learned, official: frozen_random)")

    @model_validator(mode="after")
    def _heads_divide_d(self) -> ModelParams:
        if self.d % self.heads:
            raise ValueError(f"d={self.d} must be divisible by heads={self.heads} (each head's value size is d/heads)")
        return self


class FidelityParams(_Section):
    """Where the authors' released code differs from the paper's text, one item each.

    ``null`` = taken from the dataset's profile (``catalog.<name>.fidelity``, see :data:`PROFILES`);
    :func:`for_dataset` resolves every item, so a stage (and its saved ``params.yaml``) always sees
    explicit values. Set an item (top level, or in a catalog entry's ``overrides``) to pin it.
    """

    init: Literal["pytorch", "official"] | None = Field(
        None, description="official: word embedding and W_d U(+-0.08), LSTM forget-gate bias 1 (others 0), "
        "FM/RM layers as sonnet's Linear (truncated normal sigma = 1/sqrt(fan_in), zero biases)")
    rec_loss: Literal["sum_normalized", "mse_raw"] | None = Field(
        None, description="L_rec: squared distance summed over dims with L2-normalised v~ (paper) or "
        "the mean over dims with the unnormalised v~ (official mean_squared_error)")
    rank_loss: Literal["vsepp", "official"] | None = Field(
        None, description="L_M: VSE++ hardest negative (paper) or the official crit() "
        "(no diagonal mask, reduction axes swapped, raw v~)")
    dropout: Literal["encoder_output", "encoder", "none"] | None = Field(
        None, description="where dropout acts: concept embeddings and before W_d (ours) or only the "
        "encoder (official; LSTM ablation cells get input/output dropout as its DropoutWrapper); "
        "none: nowhere (the paper states no dropout)")
    image_concepts: Literal["by_score", "official"] | None = Field(
        None, description="by_score: the 5 most confident, shuffled in training; official: dictionary "
        "(class-id) order after de-duplication, the last 5 in training, [::-1][-5:] at test, unshuffled")
    decoding: Literal["paper", "official"] | None = Field(
        None, description="paper: caption.max_len steps, a finished beam holds its slot; official (im2txt): "
        "caption.max_len - 1 steps, finished captions kept apart (<UNK>: see ban_unk)")
    ban_unk: bool | None = Field(
        None, description="beam search never generates <UNK> (ours; the paper says nothing, the official "
        "code allows it)")
    rm_input: Literal["when_needed", "always"] | None = Field(
        None, description="the RM units' input Linear: only when the input size differs from d (ours) or "
        "always (sonnet's RelationalMemory, the official code)")
    qkv_norm: bool | None = Field(
        None, description="LayerNorm over the RM's q/k/v (sonnet, ours and official; Eqs. 5-6 have none)")
    out_bias: bool | None = Field(
        None, description="a bias in W_d (ours and the official softmax_b; Eq. 8 has none)")
    xe_reduction: Literal["token_mean", "sentence_sum"] | None = Field(
        None, description="L_XE: mean over the batch's tokens (ours, official) or per-sentence sum, mean "
        "over sentences (Eq. 10)")
    similarity: Literal["cosine", "inner"] | None = Field(
        None, description="the paper forms of L_rec / L_M (rec_loss sum_normalized, rank_loss vsepp) on the "
        "L2-normalised v~ (cosine, ours) or the raw v~ (inner product, Eqs. 11-13); the official forms "
        "always take the raw v~")
    tokenizer: Literal["caption", "official"] | None = Field(
        None, description="caption: PTB-like, punctuation dropped; official: punctuation kept as tokens")
    singularise_targets: bool | None = Field(
        None, description="replace plural dictionary words by their singular inside the target sentence")
    plurals: Literal["lemma", "official"] | None = Field(
        None, description="how sentence plurals map to class words (sentence concepts and singularised "
        "targets): lemma (ours: spaCy lemma table, 'people' -> person, 'mice' -> mouse) or official (the "
        "authors' table: one regular plural per class word, 'persons' -> person; 'people', 'mice', 'stairs' kept)")
    count_specials: bool | None = Field(
        None, description="corpus_concepts.min/max_tokens and build_vocab.max_unk_ratio count <S> and </S>")
    vocab_counts: Literal["train", "all"] | None = Field(
        None, description="sentences whose words are counted for build_vocab.min_count")
    vocab_filter: str | None = Field(
        None, description="word-list file (one word per line, e.g. the GloVe vocabulary): words under "
        "build_vocab.min_count rule must also be in it; dictionary words are always kept. 'glove': the word "
        "list a paper benchmark's prepare stage fetched (UC-GAN's glove_vocab.pkl; none there: no filter and "
        "one warning line). null = from the profile (paper: none; official: glove)")
    rm_scale: Literal["key", "qkv"] | None = Field(
        None, description="the RM's attention scale: 1/sqrt(d_k) (key: sonnet 1.27 and later, incl. the 1.34 the "
        "authors' environment pins; Eq. 5) or 1/sqrt(2 d_k + d_v) (qkv: sonnet up to 1.26)")
    fm_output: Literal["fc", "flat"] | None = Field(
        None, description="FM -> RM: Eq. 4's FC to d, then the RM's input Linear (fc) or the FM's heads flattened "
        "(2 H d_k) straight into the RM's input Linear (flat: sonnet's RelationalMemory flattens its input; the "
        "LSTM decoder ablation keeps its FC, the released code's 'fusion' layer)")
    fm_attention: Literal["paper", "sonnet"] | None = Field(
        None, description="FM's q/k/v: bias-free U_q, U_k, U_v (paper, Eqs. 1-3) or sonnet's _multihead_attention "
        "(one Linear with a bias, LayerNorm over q/k/v): an assumption about the released code's unpublished "
        "MultiHeadAttention_dec, which lives in a copy of sonnet's relational_memory.py")
    long_sentences: Literal["drop", "crop"] | None = Field(
        None, description="corpus sentences over corpus_concepts.max_tokens: dropped (drop) or kept, training "
        "cropping them at the stage's max_len (crop: the released code keeps every sentence)")
    ban_specials: bool | None = Field(
        None, description="beam search never generates <pad> and <#start> (ours; the released code bans nothing)")
    cropped_v_tilde: Literal["last", "zero"] | None = Field(
        None, description="v~ of a sentence cropped at the stage's max_len (text side of train_s, train_e2e): the "
        "reconstructor's output at the last step (last) or zero (zero: the released code gathers at the full length "
        "- 1, past its padded steps, and TF's gather_nd gives 0 there on a GPU)")
    concept_per_class: bool | None = Field(
        None, description="image concepts: one per word (false) or one per detected class (true: the released "
        "code maps each class id to its name's last word, so two classes ending in one word feed it twice, each at "
        "its class id; a label outside the dictionary's class names stands for its word's first class)")
    select_on_test: bool = Field(
        False, description="image stages keep the checkpoint with the best CIDEr on the TEST images (the released "
        "eval_obj2sen.py; leakage: every table row that used it says so). In no profile: set it by hand")


# item -> (paper, official); None: the item stays null (``detect_concepts.floor``: each backend's own floor;
# ``fidelity.vocab_filter``: no word list). ``fidelity.select_on_test`` is in no profile (leakage)
PROFILES: dict[str, tuple[Any, Any]] = {
    "fidelity.init": ("pytorch", "official"),
    "fidelity.rec_loss": ("sum_normalized", "mse_raw"),
    "fidelity.rank_loss": ("vsepp", "official"),
    "fidelity.dropout": ("encoder_output", "encoder"),
    "fidelity.image_concepts": ("by_score", "official"),
    "fidelity.decoding": ("paper", "official"),
    "fidelity.ban_unk": (True, False),
    "fidelity.rm_input": ("when_needed", "always"),
    "fidelity.qkv_norm": (True, True),
    "fidelity.out_bias": (True, True),
    "fidelity.xe_reduction": ("token_mean", "token_mean"),
    "fidelity.similarity": ("cosine", "inner"),
    "fidelity.tokenizer": ("caption", "official"),
    "fidelity.singularise_targets": (False, True),
    "fidelity.plurals": ("lemma", "official"),
    "fidelity.count_specials": (False, True),
    "fidelity.vocab_counts": ("train", "all"),
    "model.image_proj": ("learned", "frozen_random"),
    "concepts.score_threshold": (0.3, 0.0),
    "detect_concepts.floor": (None, 0.0),  # None: each backend's own floor
    "fidelity.vocab_filter": (None, "glove"),
    "fidelity.rm_scale": ("key", "key"),
    "fidelity.fm_output": ("fc", "flat"),
    "fidelity.fm_attention": ("paper", "sonnet"),
    "fidelity.long_sentences": ("drop", "crop"),
    "fidelity.ban_specials": (True, False),
    "extract_features.crops": (0, 8),
    "fidelity.cropped_v_tilde": ("last", "zero"),
    "fidelity.concept_per_class": (False, True),
}
# the profile of a catalog entry whose ``fidelity`` is null, by recipe kind (others: DEFAULT_PROFILE)
BENCHMARK_KINDS = ("coco_shutterstock", "flickr30k_coco", "coco_gcc")
DEFAULT_PROFILE = "paper"  # the better on demo and tiny (docs/guide/reproduce.md)


def profile_of(entry: DatasetEntry) -> str:
    if entry.fidelity is not None:
        return entry.fidelity
    return "official" if entry.kind in BENCHMARK_KINDS else DEFAULT_PROFILE


def resolve_fidelity(raw: dict[str, Any], profile: str) -> dict[str, Any]:
    """Fill every null profile item of a raw params mapping with the profile's value."""
    col = ("paper", "official").index(profile)
    out = copy.deepcopy(raw)
    for key, values in PROFILES.items():
        section, item = key.split(".")
        sec = out.setdefault(section, {})
        if sec.get(item) is None:
            sec[item] = values[col]
    return out


class TrainParams(_Section):
    steps: int = Field(ge=1)
    batch_size: int = Field(256, ge=1, le=MAX_BATCH)
    lr: float = Field(gt=0)
    max_len: int = Field(40, ge=2)
    clip: float = Field(10.0, gt=0)
    eval_every: int = Field(500, ge=1)
    checkpoint_every: int = Field(500, ge=1)
    margin: float = Field(0.2, ge=0)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    select_by: Literal["auto", "last", "cider"] = Field(
        "auto", description="checkpoint kept: the best by val-image CIDEr (cider; image stages only), "
        "the final one (last), or auto = cider for image stages, last for text stages")


class BaselinesParams(_Section):
    """Which datasets and models the supervised baselines run on. A dataset without paired
    training captions gets one "skipped" line in the baselines tables (never an error)."""

    datasets: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=lambda: ["mrnn"])

    @field_validator("models")
    @classmethod
    def _known_models(cls, v: list[str]) -> list[str]:
        unknown = [x for x in v if x not in SUP_MODEL_NAMES]
        if unknown:
            raise ValueError(f"unknown supervised model(s) {unknown}; choose from {list(SUP_MODEL_NAMES)}")
        return v


class SupVocabParams(_Section):
    min_count: int = Field(5, ge=1, description="words seen fewer times in the training captions -> <UNK>")
    max_tokens: int = Field(40, ge=1, description="training captions longer than this are dropped")


class TrainSupParams(_Section):
    """Supervised training (all baselines): Adam on the average log-likelihood of the training
    captions given their image, plus L2 (``weight_decay``). ``per_model`` overrides keys for one model."""

    steps: int = Field(3000, ge=1)
    batch_size: int = Field(64, ge=1, le=MAX_BATCH)
    lr: float = Field(4e-4, gt=0)
    weight_decay: float = Field(1e-5, ge=0, description="L2 regularisation (Adam weight_decay)")
    max_len: int = Field(20, ge=2)
    clip: float = Field(5.0, gt=0)
    eval_every: int = Field(500, ge=1)
    checkpoint_every: int = Field(500, ge=1)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    select_by: Literal["last", "cider", "bleu4"] = Field(
        "last", description="keep the final weights, or the checkpoint with the best val CIDEr / BLEU-4 "
        "(checked every eval_every steps; Show, Attend and Tell early-stops on val BLEU)")
    pretrain_steps: int = Field(0, ge=0, description="pretrain_sup steps for models with a pretraining "
                                "phase (S-CNN-RNN); 0 = none")
    per_model: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _per_model_valid(self) -> TrainSupParams:
        for name, over in self.per_model.items():
            if name not in SUP_MODEL_NAMES:
                raise ValueError(f"per_model.{name}: not a supervised model ({list(SUP_MODEL_NAMES)})")
            bad = set(over) - (set(type(self).model_fields) - {"per_model"})
            if bad:
                raise ValueError(f"per_model.{name}: unknown key(s) {sorted(bad)}")
            try:  # the values too, as the model will see them (one line: the first problem)
                self.for_model(name)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(x) for x in first["loc"])
                raise ValueError(f"per_model.{name}.{where}: {first['msg']}") from None
        return self

    def for_model(self, name: str) -> TrainSupParams:
        # field by field, and of ``per_model`` only ``name``'s entry: a run's record then names what this model
        # reads (another model's override reruns none of its instances)
        from r2m.utils.reads import note_item

        data = {k: getattr(self, k) for k in type(self).model_fields if k != "per_model"}
        over = self.__dict__["per_model"].get(name, {})
        note_item(self, ("per_model", name), over, default={})
        return TrainSupParams(**{**data, **over})


class RetrievalParams(_Section):
    split: Literal["test", "val"] = "test"
    image_block: int = Field(32, ge=1, description="images scored against all sentences per pass")
    prior_images: int = Field(1000, ge=0, description="m-RNN's sampled images I' for P(sentence), drawn with `seed` "
                                                     "from the train images; 0 = the queried split's own images")
    seed: int = Field(0, ge=0, le=MAX_SEED)


class CaptionParams(_Section):
    beam: int = Field(3, ge=1, le=MAX_BEAM, description=f"beam width (at most {MAX_BEAM})")
    max_len: int = Field(20, ge=2)
    batch_size: int = Field(64, ge=1, le=MAX_BATCH)
    split: Literal["test", "val"] = "test"
    decoder: Literal["beam", "greedy", "sample"] = Field(
        "beam", description="supervised baselines (caption_sup): beam (width `beam`) | greedy | sample (at "
                            "`temperature`, seeded by `seed`); R2M's caption stage decodes by fidelity.decoding")
    temperature: float = Field(1.0, ge=0, description="decoder sample: softmax temperature (0 = greedy)")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="decoder sample: seed of the draws")
    no_concepts: Literal["empty", "image", "top1"] = Field(
        "empty", description="images without concepts: empty (v = 0, the paper) | image (v̂^I) | top1 (best "
                             "concept below the threshold)")


class SelectionParams(_Section):
    """How a training stage decodes the ``val`` images when it selects its checkpoint by a caption metric (R²M's
    image stages, the baselines' ``select_by``): keys of their own, so that a test-time ``caption`` setting (a beam
    sweep) re-captions and re-scores without retraining. The defaults are the test-time decoding's."""

    beam: int = Field(3, ge=1, le=MAX_BEAM, description=f"beam width (at most {MAX_BEAM})")
    max_len: int = Field(20, ge=2)
    batch_size: int = Field(64, ge=1, le=MAX_BATCH)


SCORER_NAMES = ("bleu", "meteor", "rouge", "cider", "spice")


class EvaluateParams(_Section):
    scorers: list[Literal["bleu", "meteor", "rouge", "cider", "spice"]] = Field(
        default_factory=lambda: list(SCORER_NAMES), min_length=1
    )  # [] would give a table row of blanks: refused at params load

    @field_validator("scorers")
    @classmethod
    def _one_order(cls, v: list[str]) -> list[str]:
        """A set, not a sequence: each scorer runs on its own and ``eval.json`` lists metrics in coco-caption's
        order, so the order (or a repeat) changes no result, and the resolved params (what stages re-run on)
        hold the scorers in one order."""
        return sorted(set(v), key=SCORER_NAMES.index)


class ReportParams(_Section):
    figure_images: int = Field(4, ge=0, description="qualitative examples per dataset")
    attention_image: str | None = None


# derived lists DVC read from params.yaml before its instance lists moved into dvc.yaml (refused by name)
RETIRED_KEYS = ("all_datasets", "all_seeds")


class _ParamsBase(_Section):
    """Every section but the supervised baselines' own (added from :data:`r2m.baselines.BASELINES`: :data:`Params`)."""

    datasets: list[str] = Field(default_factory=lambda: ["demo"], min_length=1)
    variants: list[str] = Field(default_factory=lambda: list(VARIANT_NAMES), min_length=1)
    seeds: list[int] = Field(default_factory=lambda: [0], description="the training seeds of every run (the DAG's "
                             "seed axis; a catalog entry's `seeds` overrides them for its dataset)")
    catalog: dict[str, DatasetEntry]
    concepts: ConceptsParams = Field(default_factory=ConceptsParams)
    detect_concepts: DetectParams = Field(default_factory=DetectParams)
    extract_features: R2MFeatureParams = Field(default_factory=R2MFeatureParams)
    sup_features: FeatureParams = Field(
        default_factory=FeatureParams, description="the supervised baselines' features (stage "
        "extract_features_sup, same schema as extract_features; the benchmarks: VGG-16 fc7 + conv5 grid)")
    corpus_concepts: CorpusParams = Field(default_factory=CorpusParams)
    build_vocab: VocabParams = Field(default_factory=VocabParams)
    model: ModelParams = Field(default_factory=ModelParams)
    fidelity: FidelityParams = Field(default_factory=FidelityParams)
    train_xe: TrainParams = Field(default_factory=lambda: TrainParams(steps=5000, lr=1e-4, max_len=30))
    train_s: TrainParams = Field(default_factory=lambda: TrainParams(steps=6000, lr=1e-4, max_len=40))
    train_m: TrainParams = Field(default_factory=lambda: TrainParams(steps=50, lr=1e-5, max_len=40))
    train_i: TrainParams = Field(default_factory=lambda: TrainParams(steps=100, lr=1e-5, max_len=40))
    train_e2e: TrainParams = Field(
        default_factory=lambda: TrainParams(steps=10000, lr=1e-4, max_len=20, eval_every=1000, checkpoint_every=1000),
        description="one-stage training (stage train_e2e, the released end2end.py; not in the tables' DAG)")
    caption: CaptionParams = Field(default_factory=CaptionParams)
    selection: SelectionParams = Field(default_factory=SelectionParams)
    baselines: BaselinesParams = Field(default_factory=BaselinesParams)
    sup_vocab: SupVocabParams = Field(default_factory=SupVocabParams)
    train_sup: TrainSupParams = Field(default_factory=TrainSupParams)
    retrieval: RetrievalParams = Field(default_factory=RetrievalParams)
    evaluate: EvaluateParams = Field(default_factory=EvaluateParams)
    report: ReportParams = Field(default_factory=ReportParams)

    @model_validator(mode="before")
    @classmethod
    def _no_derived_lists(cls, v: Any) -> Any:
        for key in RETIRED_KEYS:
            if isinstance(v, dict) and key in v:
                raise ValueError(f"{key}: no longer a params key: dvc.yaml holds the DAG's instances, written from "
                                 "these params by `r2m dag --write`; remove the line")
        return v

    @field_validator("catalog", mode="before")
    @classmethod
    def _safe_names(cls, v: Any) -> Any:
        for name in v if isinstance(v, dict) else ():
            check_name(name, "catalog: dataset name")
        return v

    @field_validator("seeds", mode="before")
    @classmethod
    def _seed_numbers(cls, v: Any) -> Any:
        return seed_numbers(v)

    @field_validator("seeds")
    @classmethod
    def _seed_list(cls, v: list[int]) -> list[int]:
        return check_seeds(v, "seeds")

    @field_validator("variants")
    @classmethod
    def _known_variants(cls, v: list[str]) -> list[str]:
        unknown = [x for x in v if x not in VARIANT_NAMES]
        if unknown:
            raise ValueError(f"unknown variant(s) {unknown}; choose from {list(VARIANT_NAMES)}")
        if "r2m" not in v:
            raise ValueError("'r2m' must be among the variants (tables 1 and 3 use it)")
        return v

    @model_validator(mode="after")
    def _datasets_in_catalog(self) -> _ParamsBase:
        missing = [d for d in self.datasets if d not in self.catalog]
        for d in self.baselines.datasets:
            if d not in self.catalog and d not in missing:
                missing.append(d)
        if missing:
            raise ValueError(
                f"datasets {missing} are not declared under 'catalog' (known: {sorted(self.catalog)})"
            )
        sections = set(type(self).model_fields) - {"datasets", "variants", "catalog", "baselines", "seeds"}
        for name, entry in self.catalog.items():
            for section in entry.overrides:
                if section not in sections:
                    raise ValueError(
                        f"catalog.{name}.overrides.{section}: not a params section "
                        f"(sections: {sorted(sections)})"
                    )
        return self


def _params_model() -> type[_ParamsBase]:
    """The full schema: :class:`_ParamsBase` plus one section per supervised baseline."""
    from pydantic import create_model

    fields: dict[str, Any] = {name: (b.params, Field(default_factory=b.params)) for name, b in BASELINES.items()}
    return create_model("Params", __base__=_ParamsBase, __module__=__name__, **fields)


Params = _params_model()


def _format_error(err: ValidationError, source: str) -> str:
    """One line: ``invalid parameters in SOURCE: key: message; key: message``."""
    parts = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        parts.append(f"{key}: {e['msg'].removeprefix('Value error, ')}")
    return f"invalid parameters in {source}: " + "; ".join(parts)


def _non_finite(data: Any, key: str = "") -> str | None:
    """The dotted key of the first ``.inf``/``.nan`` anywhere in ``data`` (backend options too)."""
    if isinstance(data, float) and not math.isfinite(data):
        return key or "<root>"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        found = _non_finite(v, f"{key}.{k}" if key else str(k))
        if found:
            return found
    return None


def validate(raw: dict[str, Any], source: str = "params") -> Params:
    """Validate a raw params mapping; raise :class:`ParamsError` naming each bad key."""
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: top level must be a mapping, got {type(raw).__name__}")
    bad = _non_finite(raw)
    if bad:
        raise ParamsError(f"invalid parameters in {source}: {bad}: not a finite number")
    try:
        params = Params.model_validate(raw)
    except ValidationError as err:
        raise ParamsError(_format_error(err, source)) from None
    # overrides must themselves validate when merged
    for name in params.catalog:
        try:
            Params.model_validate(_merged_raw(raw, name))
        except ValidationError as err:
            raise ParamsError(_format_error(err, f"{source} (catalog.{name}.overrides)")) from None
    return params


def read_text(path: Path) -> str:
    """A params file's text; :class:`ParamsError` (one line) when it is missing, a folder, a FIFO or
    device (never opened: reading one could block), a link loop, or not UTF-8."""
    from r2m.utils.guard import not_a_file

    why = not_a_file(path)
    if why == "no such file or folder":
        raise ParamsError(f"params file not found: {path}")
    if why is not None:
        raise ParamsError(f"{path}: {why}, not a params file")
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ParamsError(f"params file not found: {path}") from None
    except IsADirectoryError:
        raise ParamsError(f"{path}: is a folder, not a params file") from None
    except UnicodeDecodeError as err:
        raise ParamsError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    except OSError as err:
        raise ParamsError(f"{path}: cannot read: {err.strerror or err}") from None


def load(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    text = read_text(path)
    try:
        raw = yaml_load(text) or {}
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    return validate(raw, str(path))


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _merged_raw(raw: dict[str, Any], dataset: str) -> dict[str, Any]:
    entry = (raw.get("catalog") or {}).get(dataset) or {}
    return deep_merge(raw, entry.get("overrides") or {})


def for_dataset(params: Params, dataset: str) -> Params:
    """The params as seen by one dataset: its catalog ``overrides`` merged over the sections."""
    if dataset not in params.catalog:
        raise ParamsError(f"unknown dataset {dataset!r}; declared under 'catalog': {sorted(params.catalog)}")
    raw = params.model_dump(mode="json")
    return Params.model_validate(resolve_fidelity(_merged_raw(raw, dataset), profile_of(params.catalog[dataset])))


def with_profile(params: Params, dataset: str) -> Params:
    """``params`` with every null profile item filled from ``dataset``'s profile (no-op when resolved)."""
    raw = params.model_dump(mode="json")
    return Params.model_validate(resolve_fidelity(raw, profile_of(params.catalog[dataset])))


# --------------------------------------------------------------------------- seeds
# the sections whose ``seed`` a run's seed (the DAG's seed axis) shifts: every random choice of a run —
# initialisation, batch order, concept shuffling, dropout, hard attention's draws (torch's generator seeded
# with the training stage's seed), caption sampling, retrieval's sampled prior images
SEEDED_SECTIONS = (*TRAIN_STAGES, "train_e2e", "train_sup", "caption", "retrieval")


def seeds_for(params: Params, dataset: str, name: str | None) -> list[int]:
    """The seeds of ``dataset``'s runs of variant or baseline ``name``: its catalog entry's ``seeds`` (a
    list, or its item ``name``), else the top-level ``seeds``. A recording run names the entry's ``seeds``
    as read with the list it resolved to (unset: the top-level list, recorded too), so restating that list
    for the dataset reruns nothing; a per-name mapping is recorded whole."""
    from r2m.utils.reads import note_item, unrecorded

    if dataset not in params.catalog:
        return list(params.seeds)
    entry = params.catalog[dataset]
    with unrecorded():
        own = entry.seeds
    if isinstance(own, dict):
        own = entry.seeds.get(name or "")  # read again, recorded: the whole mapping
        return list(own if own is not None else params.seeds)
    seeds = list(own if own is not None else params.seeds)
    note_item(entry, ("seeds",), seeds, default=seeds)
    return seeds


def with_seed(params: Params, seed: int) -> Params:
    """``params`` as run ``seed`` sees them: each :data:`SEEDED_SECTIONS` ``seed`` (``train_sup``'s per-model
    ones too) plus ``seed``. Seed 0 is ``params`` itself: a single-seed run draws what it always drew."""
    if not seed:
        return params
    update: dict[str, Any] = {}
    for name in SEEDED_SECTIONS:
        section = getattr(params, name)
        update[name] = section.model_copy(update={"seed": section.seed + seed})
    per_model = {m: {**over, "seed": over["seed"] + seed} if "seed" in over else over
                 for m, over in params.train_sup.per_model.items()}
    update["train_sup"] = update["train_sup"].model_copy(update={"per_model": per_model})
    return params.model_copy(update=update)


class Views:
    """One run's validated params and the views of them its instances read, each made once: the params as
    a dataset's run at a seed sees them (:func:`for_dataset`, :func:`with_seed`, as a stage's context builds
    them) and their JSON dumps. Hold one per run (a plan of every instance's stamp, a DAG's resolved params)
    and hand it to what looks at many instances: a view costs a validation of the whole params."""

    def __init__(self, params: Params) -> None:
        self.params = params
        self._views: dict[tuple[str | None, int | None], Params] = {}
        self._dumps: dict[tuple[str | None, int | None], dict[str, Any]] = {}

    def view(self, dataset: str | None = None, seed: int | str | None = None) -> Params:
        """The params as ``dataset``'s run ``seed`` sees them; no dataset: the params themselves (at ``seed``).
        A dataset outside the catalog: :class:`ParamsError` naming the catalog."""
        key = (dataset, None if seed is None else int(seed))
        made = self._views.get(key)
        if made is None:
            made = self.params if dataset is None else for_dataset(self.params, dataset)
            made = self._views[key] = made if key[1] is None else with_seed(made, key[1])
        return made

    def dumped(self, dataset: str | None = None, seed: int | str | None = None) -> dict[str, Any]:
        """:meth:`view`'s JSON dump (``model_dump(mode="json")``)."""
        key = (dataset, None if seed is None else int(seed))
        if key not in self._dumps:
            self._dumps[key] = self.view(dataset, seed).model_dump(mode="json")
        return self._dumps[key]


def dump(params: BaseModel | dict[str, Any]) -> str:
    data = params.model_dump(mode="json") if isinstance(params, BaseModel) else params
    return yaml.safe_dump(data, sort_keys=False)
