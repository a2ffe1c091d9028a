"""The load flow: a call's key, then a hit or a miss and its publish (:mod:`.flow`); the scope of one user call; the
global random generators around a miss, and what its loader drew (:mod:`.draws`); the replay of a miss's warnings,
log records and writes on a hit.
"""
