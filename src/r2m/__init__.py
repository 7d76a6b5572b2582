"""r2m: a staged, cached pipeline for unsupervised image captioning (R2M, IJCAI 2020)."""

__version__ = "0.1.0"
