"""The paper's published numbers (Guo et al., IJCAI 2020, Tables 1–3), in percent as printed.

Columns: B-1, B-2, B-3, B-4, METEOR, ROUGE-L, CIDEr, SPICE; ``None`` where the paper prints "–".
Keys are r2m dataset names (``params.yaml`` catalog) and r2m variant / checkpoint names.
"""

from __future__ import annotations

COLUMNS = ("B-1", "B-2", "B-3", "B-4", "M", "R", "C", "S")
# table column -> coco-caption metric name
METRIC_OF = dict(zip(COLUMNS, ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE"),
                     strict=True))

DATASET_LABELS = {
    "coco_shutterstock": "MSCOCO↔Shutterstock",
    "flickr30k_coco": "Flickr30k↔MSCOCO",
    "coco_gcc": "MSCOCO↔GCC",
}

VARIANT_LABELS = {  # Table 2 row labels
    "no_fm": "D w/o FM",
    "d_lstm": "D w/o Memory in RM",
    "r_lstm": "R w/o Memory in RM",
    "dr_lstm": "D&R w/o Memory in RM",
    "r2m": "R2M",
}

CKPT_LABELS = {  # Table 3 row labels (losses added stage by stage)
    "train_xe": "L_XE",
    "train_s": "+L_rec^S",
    "train_m": "+L_M^I",
    "train_i": "+L_rec^I",
}

Row = tuple[float | None, ...]
_ = None

# Table 1: method -> numbers, per dataset (baselines first, then R2M)
TABLE1: dict[str, dict[str, Row]] = {
    "coco_shutterstock": {
        "UC-GAN": (41.0, 22.5, 11.2, 5.6, 12.4, 28.7, 28.6, 8.1),
        "R2M": (44.0, 25.4, 12.7, 6.4, 13.0, 31.3, 29.0, 9.1),
    },
    "flickr30k_coco": {
        "SME-GAN": (_, _, _, 7.9, 13.0, 32.8, 9.9, 7.5),
        "R2M": (53.1, 32.8, 19.2, 11.7, 13.7, 35.9, 18.1, 8.3),
    },
    "coco_gcc": {
        "SME-GAN": (_, _, _, 6.5, 12.9, 35.1, 22.7, 7.4),
        "R2M": (51.2, 29.5, 15.4, 8.3, 14.0, 35.0, 29.3, 9.6),
    },
}

# Table 2: variant -> numbers, per dataset
TABLE2: dict[str, dict[str, Row]] = {
    "coco_shutterstock": {
        "no_fm": (33.0, 19.0, 9.6, 4.9, 10.5, 26.9, 23.7, 7.6),
        "d_lstm": (39.9, 22.3, 10.8, 5.2, 12.1, 28.9, 25.9, 8.4),
        "r_lstm": (38.8, 21.6, 10.6, 5.1, 10.8, 26.8, 24.5, 8.0),
        "dr_lstm": (40.5, 22.3, 10.6, 5.2, 12.2, 28.8, 25.9, 8.5),
        "r2m": (44.0, 25.4, 12.7, 6.4, 13.0, 31.3, 29.0, 9.1),
    },
    "flickr30k_coco": {
        "no_fm": (52.9, 32.5, 18.8, 11.2, 13.0, 35.5, 14.9, 8.0),
        "d_lstm": (52.5, 32.4, 19.0, 11.6, 13.0, 35.5, 16.1, 7.8),
        "r_lstm": (51.5, 30.9, 17.5, 10.3, 13.3, 35.0, 16.3, 7.9),
        "dr_lstm": (52.2, 31.8, 18.5, 11.1, 13.2, 35.6, 16.0, 8.1),
        "r2m": (53.1, 32.8, 19.2, 11.7, 13.7, 35.9, 18.1, 8.3),
    },
    "coco_gcc": {
        "no_fm": (39.1, 23.4, 12.2, 6.7, 11.3, 32.4, 23.9, 7.8),
        "d_lstm": (43.0, 24.8, 12.5, 6.7, 12.4, 32.5, 27.1, 8.8),
        "r_lstm": (47.2, 26.9, 13.9, 7.3, 12.9, 33.2, 28.1, 9.0),
        "dr_lstm": (43.6, 25.8, 13.4, 7.3, 12.5, 33.3, 27.8, 8.7),
        "r2m": (51.2, 29.5, 15.4, 8.3, 14.0, 35.0, 29.3, 9.6),
    },
}

# Table 3: checkpoint -> numbers, per dataset
TABLE3: dict[str, dict[str, Row]] = {
    "coco_shutterstock": {
        "train_xe": (42.2, 23.2, 11.3, 5.7, 13.0, 29.2, 25.4, 9.0),
        "train_s": (44.7, 25.0, 12.2, 6.0, 13.3, 30.7, 27.0, 9.1),
        "train_m": (44.2, 25.4, 12.7, 6.3, 13.1, 31.3, 28.9, 9.1),
        "train_i": (44.0, 25.4, 12.7, 6.4, 13.0, 31.3, 29.0, 9.1),
    },
    "flickr30k_coco": {
        "train_xe": (49.9, 30.0, 17.1, 10.1, 13.5, 34.9, 16.4, 8.2),
        "train_s": (49.4, 29.8, 17.4, 10.5, 13.8, 35.1, 16.7, 8.2),
        "train_m": (51.8, 31.6, 18.4, 11.0, 13.9, 35.7, 17.8, 8.3),
        "train_i": (53.1, 32.8, 19.2, 11.7, 13.7, 35.9, 18.1, 8.3),
    },
    "coco_gcc": {
        "train_xe": (46.4, 25.8, 12.8, 6.7, 13.9, 32.6, 26.9, 9.3),
        "train_s": (49.2, 27.9, 14.3, 7.7, 13.6, 33.6, 28.2, 9.3),
        "train_m": (51.0, 29.3, 15.3, 8.4, 13.9, 34.8, 29.1, 9.6),
        "train_i": (51.2, 29.5, 15.4, 8.3, 14.0, 35.0, 29.3, 9.6),
    },
}


def dataset_label(name: str) -> str:
    return DATASET_LABELS.get(name, name)
