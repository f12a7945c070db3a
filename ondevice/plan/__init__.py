"""Planning: how big a draft tree to grow on this machine, or whether to draft at all.

The machine's facts (`ondevice.machine`) and latency curves (curve.py, timing.py, latency.py) →
profile.py (measured once, saved) → sequoia.py (Sequoia's DP: the best tree shape for p[k]) +
acceptance.py (p[k], learned online) → cost_model.py (seconds per emitted token of every shape) →
fallback.py (prompt lookup or the target alone when drafting does not pay) → auto.py (the planner a
pipeline consults before each answer).
"""
