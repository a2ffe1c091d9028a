"""What a loader drew from torch's global generator, and whether its result keeps any of it.

:mod:`.seeding` tells whether the program has seeded torch's generator since it was imported; :mod:`.taint` and
:mod:`.tracker` follow the drawn values through a miss's operations. Together they let one entry serve every
process that has not seeded, for a loader whose result keeps no drawn value (:mod:`..randomness`).
"""
