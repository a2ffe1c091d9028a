"""The entry codec (:mod:`.codec`): a result pickled with its storages out of band and written into a sealed memfd,
and the object rebuilt from one.
"""
