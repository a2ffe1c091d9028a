"""Overmind adapter for bitsandbytes: a quantized model is quantized once per machine, then mapped.

With ``overmind-bnb`` installed and ``overmind.activate()`` called (or any ``overmind.load`` made), a load
such as ``AutoModelForCausalLM.from_pretrained(path, quantization_config=BitsAndBytesConfig(load_in_4bit=True))``
quantizes and publishes the first time; every later load, in any process of the user, maps the packed
weights and their quantization state from shared memory.

The adapter is the module :mod:`overmind_bnb.plugin` (entry point ``overmind.adapters: bnb``). Its parts:

- :mod:`overmind_bnb.reducers`: pickle ``Params4bit`` / ``Int8Params`` with their type and state, zero-copy;
- :mod:`overmind_bnb.dispatch`: take accelerate's dispatch hooks off a model for pickling, put them back;
- :mod:`overmind_bnb.keys`: ``BitsAndBytesConfig`` as a cache-key value, and the bitsandbytes version.
"""
__version__ = "0.1.0"
