"""The claims the paper makes with Tables 1–3 (Guo et al., IJCAI 2020, §4), written once as data.

Each claim is one ordered comparison: the row ``higher`` scores above the row ``lower`` on ``metric``
(a column of :data:`r2m.reports.published.COLUMNS`; CIDEr, the primary metric, unless the paper's
sentence names another). The published numbers a claim rests on are read from
:mod:`r2m.reports.published` (:func:`published_pairs`), never copied here.

``table`` says which table's rows the two keys name: 2 = variants (final checkpoints), 3 = R2M's
training-stage checkpoints, 1 = a method of Table 1 (the published baselines, which this pipeline
does not run). ``runs_rows`` is whether both rows are ones this pipeline trains and evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass

from r2m.reports import published as P

PRIMARY = "C"  # CIDEr: the primary metric of every claim unless the paper names another


@dataclass(frozen=True)
class Claim:
    id: str
    table: int
    higher: str  # the row key claimed higher (Table 2: variant, Table 3: checkpoint, Table 1: method)
    lower: str
    statement: str
    quote: str  # the paper's sentence (§4) the claim rests on
    metric: str = PRIMARY
    datasets: tuple[str, ...] = ("coco_shutterstock", "flickr30k_coco", "coco_gcc")  # where it is published
    lower_table: int = 0  # the table of ``lower`` when it differs (Table 3's L_XE row against Table 1's baselines)

    @property
    def runs_rows(self) -> bool:
        """Both rows are this pipeline's (R2M's variants and checkpoints); Table 1's baselines are not."""
        return self.table in (2, 3) and not self.lower_table


_RM = ("For Table 2, either \"D, R or D&R w/o Memory in RM\" suffers from worse performance, e.g., on dataset "
       "MSCOCO↔GCC, dropping the CIDEr from 29.3 to 27.1, 28.1 and 27.8.")
_LOSS = ("By gradually incorporating L_rec^S, L_M^I and L_rec^I, the model performs much better. The CIDEr "
         "gradually raises from 25.4 to 27.0, 28.9 and 29.0 on MSCOCO↔Shutterstock.")

CLAIMS: tuple[Claim, ...] = (
    Claim("t1.uc_gan", 1, "R2M", "UC-GAN", "R2M scores above UC-GAN",
          "R2M exhibits large improvements across all the metrics.", datasets=("coco_shutterstock",)),
    Claim("t1.sme_gan", 1, "R2M", "SME-GAN", "R2M scores above SME-GAN",
          "R2M also raises CIDEr/SPICE, from ... 9.9/7.5 (18.1/8.3) and 22.7/7.4 (29.3/9.6).",
          datasets=("flickr30k_coco", "coco_gcc")),
    Claim("t2.no_fm", 2, "r2m", "no_fm", "D w/o FM scores below R2M",
          "Compared to the entire R2M, the performance of \"D w/o FM\" drops significantly, e.g., with 18.3%, "
          "17.7% and 18.4% reduction of CIDEr (C) on three datasets in Table 2."),
    Claim("t2.d_lstm", 2, "r2m", "d_lstm", "D w/o Memory in RM scores below R2M", _RM),
    Claim("t2.r_lstm", 2, "r2m", "r_lstm", "R w/o Memory in RM scores below R2M", _RM),
    Claim("t2.dr_lstm", 2, "r2m", "dr_lstm", "D&R w/o Memory in RM scores below R2M", _RM),
    Claim("t3.rec_s", 3, "train_s", "train_xe", "+L_rec^S scores above L_XE alone", _LOSS),
    Claim("t3.match", 3, "train_m", "train_s", "+L_M^I scores above +L_rec^S",
          "Especially after the assistance of semantic matching loss L_M, the CIDEr is significantly improved, "
          "nearly 7.0%, 6.6% and 3.2% on all datasets."),
    Claim("t3.rec_i", 3, "train_i", "train_m", "+L_rec^I scores above +L_M^I", _LOSS),
    Claim("t3.xe_sota", 3, "train_xe", "the published baseline", "L_XE alone scores above UC-GAN / SME-GAN",
          "Note that this baseline is competitive and outperforms the existing methods. The SPICE (S) is "
          "increased by around 11.1%, 9.3% and 25.7% compared on three datasets.", metric="S", lower_table=1),
)

BY_ID = {c.id: c for c in CLAIMS}
assert len(BY_ID) == len(CLAIMS)


def _value(table: int, dataset: str, key: str, metric: str) -> float | None:
    rows = {1: P.TABLE1, 2: P.TABLE2, 3: P.TABLE3}[table].get(dataset, {})
    if key == "the published baseline":  # Table 1's baseline of that dataset (every row but R2M)
        key = next((k for k in rows if k != "R2M"), "")
    row = rows.get(key)
    return None if row is None else row[P.COLUMNS.index(metric)]


def published_pairs(claim: Claim) -> list[tuple[str, float | None, float | None]]:
    """Per dataset the claim is published on: ``(dataset, higher's value, lower's value)`` from the paper's tables."""
    lower_table = claim.lower_table or claim.table
    return [(ds, _value(claim.table, ds, claim.higher, claim.metric),
             _value(lower_table, ds, claim.lower, claim.metric)) for ds in claim.datasets]


def published_text(claim: Claim) -> str:
    """``MSCOCO↔Shutterstock 29.0 vs 23.7; …``: the published numbers the claim rests on."""
    def f(v: float | None) -> str:
        return "–" if v is None else f"{v:.1f}"

    return "; ".join(f"{P.dataset_label(ds)} {f(a)} vs {f(b)}" for ds, a, b in published_pairs(claim))
