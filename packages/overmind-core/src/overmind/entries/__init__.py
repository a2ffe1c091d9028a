"""A result as an entry: the entry codec (:mod:`.codec`) pickles a result with its storages out of band and writes
it into a sealed memfd, and rebuilds the object from one."""
