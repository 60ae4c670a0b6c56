"""The transformers code an exported folder carries (``trust_remote_code``), copied beside its weights by
:mod:`headprobe.export.hf`; it imports only torch and transformers, never headprobe.

=========================  ==================================================================================
configuration_headshape    ``HeadShapeConfig``: the head-shape decoder's configuration for transformers
modeling_headshape         ``HeadShapeForCausalLM``: the head-shape decoder as transformers code
=========================  ==================================================================================
"""
