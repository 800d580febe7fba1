"""The lab's experiments, each a function of a config that returns its measurements. On the
simulated transformer: the simulation at initialization over seeds (:mod:`.simulation`, with
:mod:`.simulation.seeds`), the architecture sweep (:mod:`.sweep`), a mean planted inside a block
(:mod:`.planted`), trained models of both kinds (:mod:`.trained`) and the swap's cost on them
(:mod:`.swap`), and the training comparison (:mod:`.comparison`, ``rmsnorm compare``). On any
model: the hooks on its norm layers (:mod:`.inspection`, ``rmsnorm inspect``). On the real
pretrained models: the statistics at every norm site (:mod:`.sites`), the centering's end-to-end
cost (:mod:`.centering`), the study that runs both per model (:mod:`.realmodels`), and how far
the GGUF models move when their weights are rounded once more through their own formats
(:mod:`.quantization`)."""
