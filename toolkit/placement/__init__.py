"""Placement by cost: what running a graph's ops on a set of devices costs (``model.py``, the
interface and the cost model that needs no measurement; ``cost.py``, the one from measured
kernel timings), and the placers and schedules that choose by it (``placer.py``). Above the
compiler, below training and the commands, which use it."""
