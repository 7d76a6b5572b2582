"""The supervised baselines (image-caption pairs): each one's params section and its entry in
:data:`BASELINES`, the catalogue that :mod:`r2m.params` (names, labels, sections), :mod:`r2m.models`
(the model class) and the supervised stages read.

Light on purpose (pydantic only): validating params imports this module, and no model file. A new
baseline is its model file (a :class:`r2m.models.supervised.SupervisedCaptioner` with ``name`` set),
its params class here, one line in :data:`BASELINES` and its section in ``params.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from r2m.utils.registry import Catalog

# every params section's config: no unknown key, no bool/str coerced to a number, no .inf/.nan
STRICT = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


class Section(BaseModel):
    """A params section (every section of :mod:`r2m.params` is one)."""

    model_config = STRICT


class MRNNParams(Section):
    """m-RNN sizes (Mao et al. 2015): two word embeddings, a ReLU recurrent layer, a multimodal layer."""

    embed1: int = Field(128, ge=1)
    embed2: int = Field(256, ge=1)
    recurrent: int = Field(256, ge=1)
    multimodal: int = Field(512, ge=1)
    dropout: float = Field(0.25, ge=0, lt=1)


class SATParams(Section):
    """Show, Attend and Tell sizes (Xu et al. 2015, soft attention; r2m.models.sat)."""

    embed: int = Field(512, ge=1, description="word embedding m")
    hidden: int = Field(1000, ge=1, description="LSTM size n")
    att_dim: int = Field(0, ge=0, description="attention MLP size (0 = the annotation size D)")
    dropout: float = Field(0.5, ge=0, lt=1)
    dsr_lambda: float = Field(1.0, ge=0, description="λ of the doubly stochastic regulariser (Eq. 9)")
    selector: bool = Field(True, description="the gating scalar β")
    feature_norm: bool = Field(False, description="standardise each annotation vector (no parameters; not the seed's)")


class SATHardParams(SATParams):
    """Show, Attend and Tell with hard attention (Xu et al. 2015, Sec. 4.1; r2m.models.sat_hard)."""

    dsr_lambda: float = Field(0.0, ge=0, description="λ of the doubly stochastic regulariser (the soft model's, Eq. 9)")
    selector: bool = Field(False, description="the gating scalar β (the soft model's, Sec. 4.2.1)")
    feature_norm: bool = Field(False, description="standardise each annotation vector (no parameters)")
    reinforce_lambda: float = Field(1.0, ge=0, description="λ_r of the REINFORCE term")
    entropy_lambda: float = Field(0.002, ge=0, description="λ_e of the attention entropy term")
    baseline_decay: float = Field(0.9, ge=0, lt=1, description="decay of the moving-average baseline")
    expectation_prob: float = Field(0.5, ge=0, le=1, description="probability per image of using α instead of a sample")
    test_attention: Literal["expected", "argmax"] = Field("expected", description="context at test time")


class SCNNParams(Section):
    """S-CNN-RNN sizes and CNN mode (Liu et al. 2017; r2m.models.scnn, r2m.supervised.finetune)."""

    num_concepts: int = Field(1000, ge=1, description="k: the most frequent training-caption words")
    drop_stopwords: bool = Field(False, description="leave function words out of the concepts (the seed keeps them)")
    cnn: Literal["end_to_end", "frozen"] = Field(
        "end_to_end", description="end_to_end: the sup_features backbone fine-tuned on pixels (the seed); "
        "frozen: the precomputed sup_features")
    hidden: int = Field(512, ge=1, description="LSTM size (= word embedding)")
    dropout: float = Field(0.5, ge=0, lt=1)
    feature_norm: bool = Field(True, description="standardise the image feature (no parameters)")


@dataclass(frozen=True)
class Baseline:
    """One supervised baseline: what the code loads by its name."""

    model: str  # "module:Class" of its model, a SupervisedCaptioner whose ``name`` is the catalogue's
    label: str  # its name in the reports
    params: type[Section]  # its params section (``params.yaml: <name>``)
    phases: tuple[str, ...] = ()  # training phases beyond train_sup's ("pretrain": pretrain_sup trains one)
    inspector: str | None = None  # "module:function" of what inspect_sup shows of it (None: nothing)
    end_to_end: str | None = None  # the module that fine-tunes its CNN when its section says cnn: end_to_end


BASELINES: Catalog[Baseline] = Catalog("supervised model", {
    "mrnn": Baseline("r2m.models.mrnn:MRNN", "m-RNN", MRNNParams),
    "sat": Baseline("r2m.models.sat:SAT", "Show, Attend and Tell (soft attention)", SATParams,
                    inspector="r2m.supervised.inspect_sat:inspect"),
    # its maps: α_t, the distribution its location s_t is drawn from
    "sat_hard": Baseline("r2m.models.sat_hard:SATHard", "Show, Attend and Tell (hard attention)", SATHardParams,
                         inspector="r2m.supervised.inspect_sat:inspect"),
    "scnn": Baseline("r2m.models.scnn:SCNN", "S-CNN-RNN", SCNNParams, phases=("pretrain",),
                     inspector="r2m.supervised.inspect_scnn:inspect", end_to_end="r2m.supervised.finetune"),
}, member=lambda b: b.model)
