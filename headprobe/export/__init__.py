"""Our checkpoints in other tools' formats.

==============  ===================================================================================
hf              ``export_hf``: a Hugging Face model folder (transformers code of its own, the weights under
                transformers' names, the tokenizer files), and ``load_exported`` to read one back
hf_code         the standalone transformers code written into every export (``HeadShapeConfig``,
                ``HeadShapeForCausalLM``); it imports no headprobe
vllm            vLLM's plugin: the architecture registered by string; members vLLM cannot run refused
auto            ``register``: the head-shape classes in transformers' Auto classes, without remote code
==============  ===================================================================================
"""
