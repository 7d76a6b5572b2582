"""r2m: a staged, cached pipeline for unsupervised image captioning (R2M, IJCAI 2020)."""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("R2M_NETWORK_GUARD") == "1":  # a child of a guarded process (a spawned worker): guarded too
    from r2m.utils.netguard import inherit as _inherit

    _inherit()
