"""The models the lab studies. The simulated transformer (:mod:`.transformer`: a small GPT-style
model with a switchable norm), the one training loop that trains it (:mod:`.train`) on offline
text (:mod:`.corpus`); the real pretrained models and their loaders (:mod:`.pretrained` loads a
local directory, a GGUF file or a built-in model whose pinned weights :mod:`.weights` finds and
checks, as a :class:`~.runnable.RunnableModel`) and the text they read (:mod:`.text`); and which
modules of any model are norm layers (:mod:`.norm_layers`)."""
