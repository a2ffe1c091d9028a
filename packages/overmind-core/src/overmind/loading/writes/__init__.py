"""What a loader writes to process state outside its result (registries, class attributes, module globals), recorded
on a miss and replayed on every hit.

A hit rebuilds objects without running their constructors, so whatever a constructor writes elsewhere (a library's
process-wide registry, a class attribute it caches, a module global) would be missing in a process that only hit:
transformers records every model in ``_CAN_RECORD_REGISTRY`` from ``PreTrainedModel.__init__``, and its hooks for
``output_hidden_states`` read it. So a miss watches the containers its libraries hold at module level
(:mod:`.watched`), marks them before and after the loader (:mod:`.marks`), turns what changed into writes
(:mod:`.changes`), and the entry keeps them beside the result, pickled with it so that a write referring to an object
of the result refers to the rebuilt object (:mod:`.replay`); a hit replays them before the caller gets the result.
A change that cannot be replayed exactly (an item removed or overwritten, a value that cannot be described) means
the call is not cached, with one INFO line that names the container.
"""
