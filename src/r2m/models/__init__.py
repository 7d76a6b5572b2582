"""The caption models, one file each: R²M (``r2m.py``, its ablations by switches; the fused RM recurrence
``rm_fused.py``) and the supervised baselines (``mrnn.py``, ``sat.py``, ``sat_hard.py``, ``scnn.py``; their interface
``supervised.py``). Models by name and checkpoint loading: ``catalog.py``. This package imports none of them: a
stage loads the model it uses, so editing one model reruns only its readers.
"""
