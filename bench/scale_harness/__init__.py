"""The control-plane load harness of ``bench/scale.py``: the real job manager in its own process
(:mod:`.control_plane`) and many simulated node agents speaking the real protocol (:mod:`.agents`).
"""
