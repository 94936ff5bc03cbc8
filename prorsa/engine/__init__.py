"""Inference engines behind one contract (base.py): the emulated engine timed by the cost model,
vLLM on CPU or GPU (vllm/), and the backend registry a pipeline picks from."""
